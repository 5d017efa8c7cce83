"""The rejects stream: rows the ETL cannot parse, with source and reason; the stream goes on.

`rejects` is a declared stream (a dead-letter stream any consumer group can read),
written by one stream producer per input table. Each flush records, as the mark
`source_version`, the highest input version whose rejects it holds, so re-reading inputs
after a restart never rejects a row twice.
"""

from __future__ import annotations

import logging
import threading
import time

import polars as pl

import deltabus
from deltabus.apps.timezones.contracts import REJECTS_SCHEMA, REJECTS_TABLE
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

MARK = "source_version"
# How rejects were marked before they were a stream, per input table.
OLD_APP_ID = "deltabus-etl-rejects:{}"


class RejectsWriter:
    """Appends rejected rows to the `rejects` stream, declaring it on first use."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.bus = deltabus.Bus(lake)
        self._lock = threading.Lock()
        self._producers: dict[str, deltabus.Producer] = {}
        self._done: dict[str, int | None] = {}  # per input table: its highest version kept

    def _open(self, source_table: str) -> deltabus.Producer:
        producer = self._producers.get(source_table)
        if producer is None:
            if not self._producers:
                self.bus.create_stream(REJECTS_TABLE, REJECTS_SCHEMA)
            producer = self.bus.producer(
                REJECTS_TABLE, f"etl-rejects.{source_table}", commit_interval_ms=0
            )
            self._producers[source_table] = producer
            done = producer.mark(MARK)
            if done is None:  # rejects kept before they were a stream
                done = self.lake.open(REJECTS_TABLE).transaction_version(
                    OLD_APP_ID.format(source_table)
                )
            self._done[source_table] = done
        return producer

    def write(self, source_table: str, bad: pl.DataFrame) -> int:
        """Append rejects from `source_table`; returns how many rows were new."""
        with self._lock:
            producer = self._open(source_table)
            done = self._done[source_table]
            if done is not None:
                bad = bad.filter(pl.col("source_version") > done)
            if bad.height == 0:
                return 0
            top = int(bad["source_version"].max())  # type: ignore[arg-type]
            now_ms = int(time.time() * 1000)
            table = (
                bad.with_columns(source_table=pl.lit(source_table), time=pl.lit(now_ms, pl.Int64))
                .select(REJECTS_SCHEMA.names)
                .to_arrow()
                .cast(REJECTS_SCHEMA)
            )
            producer.send_batch(table)
            producer.flush({"etl.rejects_from": source_table}, {MARK: top})
            self._done[source_table] = top
            log.warning(
                "rejected %d row(s) from %s (first reason: %s)",
                table.num_rows,
                source_table,
                bad["reason"][0],
            )
            return table.num_rows

    def close(self) -> None:
        """Close the producers. Nothing is queued between writes: a write that failed
        raised already, so closing logs rather than raises."""
        with self._lock:
            for producer in self._producers.values():
                try:
                    producer.close()
                except Exception as exc:  # noqa: BLE001 - raised by the write that failed
                    log.debug("closing a rejects producer: %s", exc)
            self._producers.clear()
