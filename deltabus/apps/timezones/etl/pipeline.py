"""The Pathway program: tail both input tables, parse `date`, write the unified table.

Run it in its own process (`deltabus etl`); it never runs inside Dagster's process.
On start it resumes from the input positions recorded in the unified table's log, so a
killed ETL restarted with the same lake produces every message exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pathway as pw

from deltabus.apps.timezones.etl.config import EtlConfig as EtlConfig
from deltabus.apps.timezones.etl.dates import unify_chunk
from deltabus.apps.timezones.etl.positions import recorded_finished_runs
from deltabus.apps.timezones.etl.rejects import RejectsWriter
from deltabus.apps.timezones.etl.sink import DeltaSinkObserver, open_unified
from deltabus.apps.timezones.etl.source import BatchSchema, DeltaTailSubject
from deltabus.apps.timezones.etl.ticker import CommitTicker, TickGroup
from deltabus.apps.timezones.layout import TimezoneLayout, ensure_layout, read_layout
from deltabus.core import health
from deltabus.core.errors import ConfigError
from deltabus.core.gctune import tune_gc_for_streaming
from deltabus.core.retry import retry_storage, stop_waiting_on
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

DATE_FORMAT = "%Y-%m-%d %H:%M:%S.%f %z"


@dataclass
class EtlReport:
    rows: int
    rejected: int
    commits: int
    unified_version: int
    elapsed_s: float
    throughput_rows_s: float
    positions: dict[str, int]
    resumed_from: dict[str, int]
    retractions: int = 0  # rows an input lost (delete, update), written with diff -1
    skipped_change_commits: int = 0  # input commits skipped by DELTABUS_SKIP_CHANGE_COMMITS
    skipped_files: int = 0  # unreadable input data files left out (--on-corrupt-file skip)
    partitions: list[int] = field(default_factory=lambda: [0])  # the partitions it owned

    def as_dict(self) -> dict:
        return asdict(self)


@pw.udf(deterministic=True)
def _unify(rows: pw.PyObjectWrapper) -> pw.PyObjectWrapper:
    """One input version's rows in the unified contract (etl.dates.unify_chunk)."""
    return pw.wrap_py_object(unify_chunk(rows.value))


def unified_expression(batches: pw.Table) -> pw.Table:
    """Parse every version batch's `date` into epoch milliseconds (UTC).

    `rows` becomes an Arrow table of `timestamp` (the double nearest to the date's epoch
    milliseconds), `message` and `diff` (-1 for a row an input lost: delete, update
    pre-image), which the sink writes with the batch's Pathway time as every row's `time`
    (the time a flattened row would carry: flattening keeps its batch's time). A batch is
    one Pathway row: the engine's cost per row, not per message (BatchSchema). The UDF is
    deterministic, so Pathway keeps no copy of its results.
    """
    return batches.select(rows=_unify(pw.this.rows), source=pw.this.source, version=pw.this.version)


@dataclass
class _Flow:
    """One unified partition's part of the dataflow: its input tails and its sink."""

    subjects: list[DeltaTailSubject]
    sink: DeltaSinkObserver
    resumed_from: dict[str, int]

    def tick_group(self) -> TickGroup:
        """The inputs to commit while rows sent to them have not reached the sink."""
        subjects, sink = self.subjects, self.sink
        return TickGroup(
            subjects, lambda: any(s.sent_version > sink.seen(s.table) for s in subjects)
        )


def _partition_flow(
    lake: Lake,
    config: EtlConfig,
    layout: TimezoneLayout,
    partition: int,
    mode: str,
    stop: threading.Event,
    rejects: RejectsWriter,
    mark_ready: Callable[[], None],
    epochs: dict[str, int],
) -> _Flow:
    """Tail partition `partition` of both inputs into its unified table: claim that table
    (fencing any older ETL of it), resume from its recorded positions, and add the
    sources, the transform and the sink to the dataflow."""
    table = layout.unified_of(partition)
    inputs = layout.inputs_of(partition)
    output = open_unified(lake, table, inputs, mode)
    if output.lease is not None:
        epochs[table] = output.lease.epoch
    positions = output.positions
    finished = retry_storage(
        lambda: recorded_finished_runs(output.snapshot),
        what=f"read finished producer runs of {table}",
    )
    log.info(
        "ETL (%s) on %s: %s resumes after input versions %s",
        mode,
        lake.settings.describe(),
        table,
        positions,
    )
    subjects = [
        DeltaTailSubject(
            lake,
            source,
            positions[source] + 1,
            bounded=config.bounded,
            expected_producers=config.expected_producers,
            until_runs=config.until_runs,
            poll_interval=config.poll_interval,
            stop=stop,
            rejects=rejects,
            on_start=mark_ready,
            finished_runs=finished.get(source, set()),
            skip_change_commits=lake.settings.skip_change_commits,
            skip_corrupt_files=(config.on_corrupt_file or lake.settings.on_corrupt_file) == "skip",
        )
        for source in inputs
    ]
    streams = [
        pw.io.python.read(
            subject,
            schema=BatchSchema,
            autocommit_duration_ms=None,  # committed by the CommitTicker
            name=f"delta_{subject.table}",
        )
        for subject in subjects
    ]
    unified_rows = unified_expression(pw.Table.concat_reindex(*streams))
    sink = DeltaSinkObserver(
        output,
        config.commit_interval,
        finished_runs=lambda: {s.table: sorted(s.stats.finished_runs) for s in subjects},
        on_failure=lambda _exc: stop.set(),
    )
    pw.io.python.write(unified_rows, sink, name=f"delta_{table}")
    return _Flow(subjects, sink, positions)


def run_etl(
    lake: Lake,
    config: EtlConfig,
    stop: threading.Event | None = None,
    ready_file: Path | None = None,
) -> EtlReport:
    """Run the ETL until both inputs finish (bounded) or until `stop` / SIGTERM (continuous).

    `ready_file` is created once the dataflow runs, so a launcher can wait for it.
    """
    stop = stop or threading.Event()
    layout = ensure_layout(lake, config.partitions) if config.partitions else read_layout(lake)
    owned = layout.owned(config.process, config.processes)
    if config.only is not None:
        if not config.only or not all(0 <= i < layout.partitions for i in config.only):
            raise ConfigError(
                f"partitions {list(config.only)} are not partitions of this lake, which "
                f"has {layout.partitions} per stream",
                f"give partitions 0..{layout.partitions - 1}",
            )
        owned = sorted(set(config.only))
    mode = "bounded" if config.bounded else "continuous"
    ready_once = threading.Lock()
    epochs: dict[str, int] = {}

    def mark_ready() -> None:
        """Write the ready file (atomically, once) with this ETL's pid and epochs, and
        report the process ready on its health endpoint."""
        health.mark_ready()
        if ready_file is None or not ready_once.acquire(blocking=False):
            return
        tmp = Path(f"{ready_file}.tmp")
        epoch = next(iter(epochs.values())) if len(epochs) == 1 else epochs
        tmp.write_text(json.dumps({"pid": os.getpid(), "epoch": epoch, "mode": mode}))
        tmp.replace(ready_file)

    rejects = RejectsWriter(lake)
    flows = [
        _partition_flow(lake, config, layout, i, mode, stop, rejects, mark_ready, epochs)
        for i in owned
    ]
    subjects = [s for flow in flows for s in flow.subjects]
    sinks = [flow.sink for flow in flows]
    ticker = CommitTicker([flow.tick_group() for flow in flows], config.tick_ms / 1000)
    for subject in subjects:
        subject.on_sent = ticker.rows_sent

    def request_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    os.environ["PATHWAY_THREADS"] = str(config.threads)
    tune_gc_for_streaming()

    def not_echoed(record: logging.LogRecord) -> bool:
        """Pathway logs a failed connector's error; the one an input tail raised is
        raised from here instead, and told once."""
        return record.levelno < logging.ERROR or all(s.error is None for s in subjects)

    connectors_log = logging.getLogger("pathway_engine.connectors")
    connectors_log.addFilter(not_echoed)
    started = time.monotonic()
    ticker.start()
    try:
        with stop_waiting_on(stop):  # a stop during an outage does not wait it out
            pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    except Exception as exc:
        # A connector thread failed: raise its own error (a DeltabusError tells the user
        # what to fix), not Pathway's wrapper around it.
        errors = [k.error for k in sinks] + [s.error for s in subjects]
        failed = next((e for e in errors if e is not None), None)
        if failed is not None and failed is not exc:
            raise failed from None
        raise
    finally:
        connectors_log.removeFilter(not_echoed)
        ticker.close()
        rejects.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    for sink in sinks:
        if sink.error is not None:  # the sources stopped because the sink had failed
            raise sink.error
    elapsed = time.monotonic() - started
    rows = sum(k.stats.rows for k in sinks)
    return EtlReport(
        rows=rows,
        rejected=sum(s.stats.rejected for s in subjects),
        commits=sum(k.stats.commits for k in sinks),
        # The unified table's version (P = 1), else the highest of the partitions owned.
        unified_version=max(k.stats.version for k in sinks),
        elapsed_s=round(elapsed, 3),
        throughput_rows_s=round(rows / elapsed, 1) if elapsed else 0.0,
        positions={t: v for k in sinks for t, v in k.positions.items()},
        resumed_from={t: v for f in flows for t, v in f.resumed_from.items()},
        partitions=owned,
        retractions=sum(s.stats.retractions for s in subjects),
        skipped_change_commits=sum(s.stats.skipped_change_commits for s in subjects),
        skipped_files=sum(s.stats.skipped_files for s in subjects),
    )
