"""The Delta consumers: `timezone_unified` tailed one commit at a time, one tail per
partition (deltabus_bench.consumer has what every consumer shares)."""

from __future__ import annotations

import logging
import threading
import time

import polars as pl
import pyarrow as pa

from deltabus_bench.consumer import (
    SEEN_SCHEMA,
    LiveStats,
    Sink,
    TailConsumer,
)

log = logging.getLogger(__name__)

# Most commits one poll reads before it hands their rows on.
MAX_COMMITS_PER_POLL = 32


class DeltaUnifiedConsumer(TailConsumer):
    """Tails `timezone_unified` like the ETL tails its inputs: one GET of the next commit.

    Every row keeps its `diff`: +1 rows are what the live statistics and the first-seen
    samples count, -1 rows (retractions) are kept for the analysis to account for.
    """

    DATA_COLUMNS = ["message", "timestamp", "time", "diff"]

    def __init__(
        self,
        lake,
        poll_s: float,
        stats: LiveStats,
        table: str | None = None,
        sink: Sink | None = None,
    ) -> None:
        from deltabus.apps.timezones.contracts import UNIFIED_TABLE

        self.table_name = table or UNIFIED_TABLE
        super().__init__(poll_s, stats, name=f"consumer-{self.table_name}", sink=sink)
        self.lake = lake
        self.dt = None
        self.next_version = 0  # 0: the version after the current one when it starts
        self.versions = 0
        self._tail = None
        self._pacer = None

    def setup(self) -> None:
        from deltabus.bus.pacing import Pacer
        from deltabus.bus.tail import DeltaLogTail
        from deltabus.core.retry import retry_storage

        table = self.table_name
        dt = retry_storage(lambda: self.lake.open(table), what=f"open {table}")
        self.dt = dt
        if self.next_version <= 0:
            self.next_version = dt.version() + 1
        self._tail = DeltaLogTail(self.lake, table, columns=self.DATA_COLUMNS)
        self._pacer = Pacer(self.lake, table, self.poll_s, self.stop_event)
        # The table state before the first version to read, loaded now, not on the hot path.
        tail = self._tail
        retry_storage(lambda: tail.start(self.next_version), what="read the unified table state")

    def idle(self) -> None:
        """Nothing to do: every poll waits for its pacer first (`poll_once`)."""

    def poll_once(self) -> pa.Table | None:
        from deltabus.bus.pacing import read_landed
        from deltabus.core.retry import retry_storage

        # Also after a poll that found rows: polling again at once would only miss.
        self._pacer.wait()
        tail = self._tail
        # The commits first, then their rows, so the data files of every commit found
        # are fetched side by side.
        commits, refused = read_landed(
            tail, self._pacer, self.next_version, MAX_COMMITS_PER_POLL, f"poll {self.table_name}"
        )
        if refused is not None:
            raise refused
        self.next_version += len(commits)
        self.versions += len(commits)
        parts = []
        for commit in commits:
            rows = retry_storage(lambda c=commit: tail.rows(c), what=f"read {self.table_name}")
            if rows is not None:
                parts.append(rows)
        self._pacer.found(len(commits), commits[-1].timestamp_ms if commits else None)
        if not parts:
            return None
        seen_ms = time.time() * 1000
        frame = pl.from_arrow(pa.concat_tables(parts))
        assert isinstance(frame, pl.DataFrame)
        frame = frame.select(
            message=pl.col("message").cast(pl.String),
            timestamp=pl.col("timestamp").cast(pl.Float64),
            etl_processed_ms=pl.col("time").cast(pl.Float64),
            unified_commit_ms=pl.col("_commit_timestamp")
            .cast(pl.Datetime("ms"))
            .dt.epoch("ms")
            .cast(pl.Float64),
            seen_ms=pl.lit(seen_ms, pl.Float64),
            diff=pl.col("diff").cast(pl.Int64),
        )
        return frame.to_arrow().cast(SEEN_SCHEMA)


class PartitionedConsumer:
    """One `DeltaUnifiedConsumer` per unified partition, seen as one consumer by the runner:
    a reader of a partitioned stream reads every partition (as a Kafka consumer of every
    partition of a topic would)."""

    def __init__(
        self, lake, poll_s: float, stats: LiveStats, tables: list[str], sink: Sink | None = None
    ) -> None:
        self.parts = [DeltaUnifiedConsumer(lake, poll_s, stats, table=t, sink=sink) for t in tables]
        self.next_versions: dict[str, int] = {}
        self.ready = threading.Event()

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.parts)

    @property
    def inserted(self) -> int:
        return sum(c.inserted for c in self.parts)

    @property
    def last_progress(self) -> float:
        return max(c.last_progress for c in self.parts)

    @property
    def error(self) -> BaseException | None:
        return next((c.error for c in self.parts if c.error is not None), None)

    def start(self) -> None:
        for c in self.parts:
            c.next_version = self.next_versions.get(c.table_name, 0)
            c.start()
        for c in self.parts:
            c.ready.wait(60)
        self.ready.set()

    def stop(self, timeout: float = 30) -> None:
        for c in self.parts:
            c.stop_event.set()
        for c in self.parts:
            c.join(timeout)

    def table(self) -> pa.Table:
        return pa.concat_tables([c.table() for c in self.parts])
