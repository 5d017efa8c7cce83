"""`deltabus produce` and `deltabus consume`: the time-zone producer, and a stream of your
own as JSON lines on stdin and stdout."""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import date, datetime
from enum import StrEnum
from typing import IO, Annotated, Any

import typer

from deltabus.cli.common import PartitionsOption, parse_instant_us
from deltabus.cli.root import app
from deltabus.cli.state import emit, lake, open_bus, state
from deltabus.core import health
from deltabus.core.errors import ConfigError
from deltabus.core.extras import needs_extra
from deltabus.core.intervals import DEFAULT_COMMIT_INTERVAL_MS, from_ms

log = logging.getLogger("deltabus")


@app.command()
def produce(
    rate: Annotated[float, typer.Option(help="Messages per second (open-loop schedule).")] = 10_000,
    duration: Annotated[
        float | None, typer.Option(help="Seconds to produce for (or give --count).")
    ] = None,
    count: Annotated[
        int | None, typer.Option(help="Number of messages (or give --duration).")
    ] = None,
    commit_interval_ms: Annotated[
        float, typer.Option(help="One commit per table per interval (1 .. 60000 ms).")
    ] = DEFAULT_COMMIT_INTERVAL_MS,
    seed: Annotated[int, typer.Option(help="Seed for the table each message goes to.")] = 0,
    start_at: Annotated[
        str | None,
        typer.Option(
            help="Schedule from this ISO instant (e.g. 2026-03-08T06:59:55Z) instead of now; "
            "past schedules are sent at once."
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            help="Run id (lower-case letters, digits, '_', '-', '.'); rerun with the same "
            "id to resume without duplicates."
        ),
    ] = None,
    partitions: PartitionsOption = None,
    stream: Annotated[
        str | None,
        typer.Option(
            help="Send JSON lines from stdin to this declared stream instead (deltabus "
            "streams create); only --producer-id and --commit-interval-ms apply then."
        ),
    ] = None,
    producer_id: Annotated[
        str | None,
        typer.Option(
            help="With --stream: the producer's stable name. Run again with the same id "
            "and input to send what was not committed, exactly once (default: a new id)."
        ),
    ] = None,
) -> None:
    """Write messages from New York and Paris into timezone1 and timezone2 (or their
    partitions: each commit window's messages go to one partition, the next window's to
    the next; a window of more than 65,536 messages is cut into chunks that go on in turn).
    With --stream, send one JSON object per stdin line to a stream of your own."""
    if stream is not None:
        produce_stream(stream, producer_id, commit_interval_ms, sys.stdin)
        return
    with needs_extra("pathway", "deltabus produce without --stream (the time-zone producer)"):
        from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer

    if duration is None and count is None:
        duration = 10.0
    extra = {"run_id": run_id} if run_id else {}
    config = ProducerConfig(
        rate=rate,
        duration=duration,
        count=count,
        commit_interval=from_ms(commit_interval_ms),
        seed=seed,
        start_us=parse_instant_us(start_at) if start_at else None,
        partitions=partitions,
        **extra,
    )
    lk = lake(write=True)
    log.info(
        "producing %d messages at %.0f msg/s to %s (run %s)",
        config.total,
        config.rate,
        lk.settings.describe(),
        config.run_id,
    )
    report = TimezoneProducer(lk, config).run(
        on_progress=lambda p: log.info(
            "produced %d/%d messages, %.3fs behind schedule", p["messages"], p["total"], p["lag_s"]
        )
    )
    emit("producer report", report.as_dict())


class Start(StrEnum):
    beginning = "beginning"
    end = "end"


class OffsetReset(StrEnum):
    earliest = "earliest"
    latest = "latest"
    error = "error"


@app.command()
def consume(
    stream: Annotated[list[str], typer.Option(help="Declared stream to read (repeatable).")],
    group: Annotated[str, typer.Option(help="Consumer group: its members share the partitions.")],
    start: Annotated[
        Start, typer.Option(help="Where a group that never read a partition starts.")
    ] = Start.beginning,
    max_records: Annotated[
        int | None,
        typer.Option(help="Stop after the batch that reaches this many records."),
    ] = None,
    idle_exit_s: Annotated[
        float | None,
        typer.Option(help="Stop after this many seconds without a new record."),
    ] = None,
    auto_offset_reset: Annotated[
        OffsetReset,
        typer.Option(
            help="When the group's position fell behind the stream's retention (Kafka's "
            "auto.offset.reset): go on from what lands next (latest, Kafka's default), "
            "from the oldest version kept (earliest), both with a warning on stderr, or "
            "stop with exit status 2 (error)."
        ),
    ] = OffsetReset.latest,
) -> None:
    """Write a stream's records to stdout as JSON lines (its columns, diff: +1 or -1 for a
    record another writer deleted, _stream, _partition, _version), as a member of a
    consumer group; the group's position is committed after each batch is written."""
    consume_stream(stream, group, start.value, max_records, idle_exit_s, auto_offset_reset.value)


def _record(line: str, number: int, types: dict[str, Any]) -> dict[str, Any]:
    """One JSON line as a record: ISO text in timestamp and date columns becomes their
    value; numbers there are taken in the column's unit."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"line {number}: not JSON ({exc.msg})", "give one JSON object per line"
        ) from None
    if not isinstance(record, dict):
        raise ConfigError(f"line {number}: not a JSON object", "give one JSON object per line")
    for name, kind in types.items():
        value = record.get(name)
        if isinstance(value, str) and kind in ("timestamp", "date"):
            try:
                parsed = datetime.fromisoformat(value)
                record[name] = parsed.date() if kind == "date" else parsed
            except ValueError:
                raise ConfigError(
                    f"line {number}: {name} is not an ISO date or time: {value!r}",
                    "write e.g. 2026-11-26T12:00:00Z, or a number in the column's unit",
                ) from None
    return record


def produce_stream(
    name: str, producer_id: str | None, commit_interval_ms: float, lines: IO[str]
) -> None:
    """Send stdin's JSON lines to stream `name`, one record per non-blank line; with a
    producer id seen before, the records it already committed are skipped, counted as
    records, not lines (rerun with the same input to finish it)."""

    import pyarrow as pa

    from deltabus.bus.producer import RecordError

    bus = open_bus()
    stream = bus.stream(name)
    types = {
        f.name: "timestamp"
        if pa.types.is_timestamp(f.type)
        else "date"
        if pa.types.is_date(f.type)
        else ""
        for f in stream.schema
    }
    pid = producer_id or f"cli-{uuid.uuid4().hex[:12]}"
    producer = bus.producer(name, pid, int(commit_interval_ms))
    health.mark_ready()
    skip = producer.committed
    if skip:
        log.info("producer %s committed %d records before: skipping that many", pid, skip)
    number = records = 0
    try:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            records += 1
            if records <= skip:
                continue
            try:
                producer.send(_record(line, number, types))
            except RecordError as exc:
                raise ConfigError(f"line {number}: {exc.problem}", exc.hint) from None
    except ConfigError as exc:
        committed = producer.flush()
        producer.close()
        raise ConfigError(
            f"{exc.problem}; the {committed} records before it are committed, nothing after",
            f"{exc.hint}; then run again with --producer-id {pid} and the same input to "
            "send the rest",
        ) from None
    producer.close()
    report = {"stream": name, "producer_id": pid, "committed": producer.committed, "skipped": skip}
    print(json.dumps(report), file=sys.stderr if not state.as_json else sys.stdout)


def consume_stream(
    name: list[str],
    group: str,
    start: str,
    max_records: int | None,
    idle_exit_s: float | None,
    auto_offset_reset: str = "latest",
) -> None:
    """Write the streams' records as JSON lines (columns, `diff`, `_stream`,
    `_partition`, `_version`), committing after each batch is written; a position behind
    the retention is moved as `auto_offset_reset` says (or stops the command)."""
    bus = open_bus()
    consumer = bus.consumer(
        name, group, start=start, auto_commit=False, auto_offset_reset=auto_offset_reset
    )
    health.mark_ready()  # a member of the group
    written, idle_since = 0, time.monotonic()
    try:
        while max_records is None or written < max_records:
            batch = consumer.poll(0.5)
            if batch is None:
                consumer.commit()  # past commits that changed no rows, if any were read
                if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                    break
                continue
            idle_since = time.monotonic()
            for row in _rows(batch):
                sys.stdout.write(json.dumps(row, default=_plain) + "\n")
                written += 1
            sys.stdout.flush()
            consumer.commit()
    finally:
        consumer.close()


def _rows(batch: Any) -> Iterator[dict[str, Any]]:
    for row in batch.rows.to_pylist():
        yield {
            **row,
            "_stream": batch.stream,
            "_partition": batch.partition,
            "_version": batch.version,
        }


def _plain(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
