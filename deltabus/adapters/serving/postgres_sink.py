"""The PostgreSQL serving sink: tail `timezone_unified` (deltabus.adapters.serving.sink_loop) and
apply each run of commits to the served table in one transaction with the sink's
position (deltabus.adapters.serving.postgres_target).

A fresh sink loads the table's current net content in one transaction, then follows the
commits after it. PostgreSQL going away mid-stream is waited out: the sink reconnects,
reads its position back and goes on after it, so a COMMIT whose answer was lost is
neither repeated nor skipped.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

from deltabus.adapters.serving import pg
from deltabus.adapters.serving.postgres_target import PostgresTarget
from deltabus.adapters.serving.sink_loop import Applied, ServeConfig, SinkLoop
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.bus.tail import Commit
from deltabus.delta.lake import Lake

__all__ = ["PostgresSink", "ServeConfig", "ServeReport"]


@dataclass
class ServeReport:
    served_table: str
    postgres: str
    source: str
    version: int = -1  # the last unified version in the served table
    unified_version: int = -1  # the newest unified version the sink knows of
    snapshot_rows: int = 0
    transactions: int = 0
    versions: int = 0
    rows_upserted: int = 0
    rows_deleted: int = 0
    # Rows upserted (snapshot included) whose message holds a NUL character, stored as
    # its JSON string literal with message_escaped true (PostgreSQL text cannot hold NUL).
    rows_escaped: int = 0
    reconnects: int = 0
    served_rows: int | None = None
    lag_s: float = 0.0  # unified commit -> visible in PostgreSQL, for the last transaction
    elapsed_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class PostgresSink(SinkLoop):
    """One PostgreSQL sink process's loop (see the module docstring)."""

    target: PostgresTarget

    def __init__(
        self, lake: Lake, dsn: str, config: ServeConfig, stop: threading.Event | None = None
    ) -> None:
        target = PostgresTarget(dsn, config.table, source=lake.uri(UNIFIED_TABLE))
        super().__init__(lake, target, config, stop)
        self.report = ServeReport(
            served_table=config.table, postgres=pg.describe(dsn), source=lake.uri(UNIFIED_TABLE)
        )

    def run(self) -> ServeReport:
        try:
            self.serve()
        finally:
            self.report.version = self.position
            self.report.unified_version = self.unified_version
            self.report.reconnects = self.reconnects
        return self.report

    def _snapshot_loaded(self, applied: Applied, version: int) -> None:
        self.report.snapshot_rows = applied.inserted
        self.report.rows_escaped += applied.escaped
        self.report.transactions += 1

    def _commits_applied(self, applied: Applied, commits: list[Commit]) -> None:
        r = self.report
        r.transactions += 1
        r.versions += len(commits)
        r.rows_upserted += applied.inserted
        r.rows_deleted += applied.deleted
        r.rows_escaped += applied.escaped
        r.lag_s = round(max(0.0, applied.committed_ms - commits[-1].timestamp_ms) / 1000, 3)

    def _finished(self, served: int | None, elapsed_s: float) -> None:
        self.report.served_rows = served
        self.report.elapsed_s = elapsed_s

    def _progress_line(self) -> str:
        r = self.report
        return (
            f"{r.transactions} transactions, {r.rows_upserted} rows upserted, "
            f"{r.rows_deleted} deleted, last lag {r.lag_s:.3f} s"
        )
