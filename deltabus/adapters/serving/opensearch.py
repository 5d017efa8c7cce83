"""The OpenSearch serving sink: tail `timezone_unified` (deltabus.adapters.serving.sink_loop) and
keep an index equal to its net content, one document per message, with every write
versioned by the unified version (deltabus.adapters.serving.opensearch_target).

A fresh sink loads the net content at one recorded version, then follows the commits
after it. A sink killed at any point, or an OpenSearch restart, is recovered by reading
the position document back and replaying the commits after it: writes already applied
are refused by their versions, so the index ends as if each commit was applied once.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.opensearch_target import (
    DEFAULT_IN_FLIGHT,
    DEFAULT_REFRESH_INTERVAL_MS,
    OpenSearchTarget,
)
from deltabus.adapters.serving.sink_loop import Applied, ServeConfig, SinkLoop
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.bus.tail import Commit
from deltabus.delta.lake import Lake


@dataclass
class IndexReport:
    index: str
    opensearch: str
    source: str
    version: int = -1  # the last unified version in the index
    unified_version: int = -1  # the newest unified version the sink knows of
    snapshot_docs: int = 0
    batches: int = 0  # runs of commits applied, each with its position move
    versions: int = 0
    docs_indexed: int = 0
    docs_deleted: int = 0
    # Writes the index already held (refused by their version, or a document already
    # gone): a replay after a crash shows up here, not twice in the index.
    already_applied: int = 0
    reconnects: int = 0
    indexed_docs: int | None = None
    lag_s: float = 0.0  # unified commit -> searchable in OpenSearch, for the last batch
    elapsed_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class OpenSearchSink(SinkLoop):
    """One OpenSearch sink process's loop (see the module docstring)."""

    target: OpenSearchTarget

    def __init__(
        self,
        lake: Lake,
        url: str,
        config: ServeConfig,
        stop: threading.Event | None = None,
        refresh_interval_ms: int = DEFAULT_REFRESH_INTERVAL_MS,
        in_flight: int = DEFAULT_IN_FLIGHT,
    ) -> None:
        target = OpenSearchTarget(
            url,
            config.table,
            source=lake.uri(UNIFIED_TABLE),
            refresh_interval_ms=refresh_interval_ms,
            in_flight=in_flight,
        )
        super().__init__(lake, target, config, stop)
        self.report = IndexReport(
            index=config.table, opensearch=osc.describe(url), source=lake.uri(UNIFIED_TABLE)
        )

    def run(self) -> IndexReport:
        try:
            self.serve()
        finally:
            self.report.version = self.position
            self.report.unified_version = self.unified_version
            self.report.reconnects = self.reconnects
        return self.report

    def _snapshot_loaded(self, applied: Applied, version: int) -> None:
        self.report.snapshot_docs = applied.inserted + applied.already_applied
        self.report.already_applied += applied.already_applied
        self.report.batches += 1

    def _commits_applied(self, applied: Applied, commits: list[Commit]) -> None:
        r = self.report
        r.batches += 1
        r.versions += len(commits)
        r.docs_indexed += applied.inserted
        r.docs_deleted += applied.deleted
        r.already_applied += applied.already_applied
        r.lag_s = round(max(0.0, applied.committed_ms - commits[-1].timestamp_ms) / 1000, 3)

    def _finished(self, served: int | None, elapsed_s: float) -> None:
        self.report.indexed_docs = served
        self.report.elapsed_s = elapsed_s

    def _progress_line(self) -> str:
        r = self.report
        return (
            f"{r.batches} batches, {r.docs_indexed} documents indexed, {r.docs_deleted} "
            f"deleted, {r.already_applied} already applied, last lag {r.lag_s:.3f} s"
        )
