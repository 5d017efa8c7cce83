"""Delta tail source: a Pathway Python connector that reads new Delta versions only.

Each poll reads the next commit of the Delta log (deltabus.tail): one GET, which also
says whether the version has landed; the rows it appended are read from its data files
(compaction commits add none). Every Delta
version becomes ONE Pathway row holding the whole batch as a list; the pipeline flattens
it in Rust. That keeps the per-row Python hop out of the hot path: Python touches a
batch, not a message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pathway as pw
import pyarrow as pa
from deltalake import DeltaTable

from deltabus.errors import StorageError
from deltabus.etl.rejects import RejectsWriter
from deltabus.etl.validate import split_valid
from deltabus.lake import Lake
from deltabus.retry import retry_storage
from deltabus.tables import meta
from deltabus.tail import Commit, DeltaLogTail

log = logging.getLogger(__name__)

NOT_DELTA_GRACE_S = 10.0


class BatchSchema(pw.Schema):
    """One Delta version of one input table."""

    rows: list[tuple[str, str, int]]  # (date, message, diff: +1 insert, -1 retraction)
    source: str
    version: int


@dataclass
class SourceStats:
    rows: int = 0
    rejected: int = 0
    versions: int = 0
    latest_version: int = -1
    finished_runs: set[str] = field(default_factory=set)


class DeltaTailSubject(pw.io.python.ConnectorSubject):
    """Tails one Delta table from `start_version` on."""

    def __init__(
        self,
        lake: Lake,
        table: str,
        start_version: int,
        *,
        bounded: bool,
        expected_producers: int,
        poll_interval: float,
        stop: threading.Event,
        rejects: RejectsWriter,
        max_versions_per_read: int = 50,
        on_start: Callable[[], None] | None = None,
        finished_runs: set[str] | None = None,
    ) -> None:
        super().__init__(datasource_name=f"delta:{table}")
        self.lake = lake
        self.table = table
        self.next_version = start_version
        self.bounded = bounded
        self.expected_producers = expected_producers
        self.poll_interval = poll_interval
        self.stop = stop
        self.rejects = rejects
        self.max_versions_per_read = max_versions_per_read
        self.stats = SourceStats(finished_runs=set(finished_runs or ()))
        self.on_start = on_start

    @property
    def _deletions_enabled(self) -> bool:
        return False

    def _wait_for_table(self) -> DeltaTable | None:
        """Wait for the input table; files without a Delta log for long are an error.

        A writer creating a table puts data files before the first log entry, so files
        without a log are only an error once they stay that way for `NOT_DELTA_GRACE_S`.
        """
        announced = False
        not_delta_since: float | None = None
        while not self.stop.is_set():
            try:
                found = retry_storage(
                    lambda: self.lake.require_delta_or_absent(self.table),
                    what=f"look for {self.table}",
                )
            except StorageError:
                not_delta_since = not_delta_since or time.monotonic()
                if time.monotonic() - not_delta_since > NOT_DELTA_GRACE_S:
                    raise
                found = False
            if found:
                log.info(
                    "input table %s found, tailing from version %d", self.table, self.next_version
                )
                return retry_storage(lambda: self.lake.open(self.table), what=f"open {self.table}")
            if not announced:
                log.info(
                    "waiting for input table %s at %s to be created",
                    self.table,
                    self.lake.uri(self.table),
                )
                announced = True
            self.stop.wait(max(self.poll_interval, 0.2))
        return None

    def run(self) -> None:
        if self.on_start:
            self.on_start()
        dt = self._wait_for_table()
        if dt is None:
            return
        if self.bounded and self.next_version > 0:
            # Finish markers in versions an earlier run already processed still count.
            for info in retry_storage(dt.history, what=f"history of {self.table}"):
                if info.get("version", -1) < self.next_version:
                    self._note_finished(info)
        tail = DeltaLogTail(self.lake, self.table)
        while not self.stop.is_set():
            commits = self._fetch_available(tail)
            if commits:
                self._emit(tail, commits)
                if len(commits) == self.max_versions_per_read:
                    continue  # behind: read on right away
            elif self.bounded and len(self.stats.finished_runs) >= self.expected_producers:
                log.info("input %s finished at version %d", self.table, self.next_version - 1)
                return
            self.stop.wait(self.poll_interval)

    def _fetch_available(self, tail: DeltaLogTail) -> list[Commit]:
        """The commits that have landed from `next_version` on (at most a read's worth)."""
        commits: list[Commit] = []
        while len(commits) < self.max_versions_per_read:
            version = self.next_version + len(commits)
            commit = retry_storage(lambda v=version: tail.commit(v), what=f"poll {self.table}")
            if commit is None:
                break
            commits.append(commit)
        return commits

    def _emit(self, tail: DeltaLogTail, commits: list[Commit]) -> None:
        """Validate the commits' rows and send one Pathway row per version."""
        parts = [
            rows
            for c in commits
            if (rows := retry_storage(lambda c=c: tail.rows(c), what=f"read {self.table}"))
        ]
        for commit in commits:
            self._note_finished(commit.info)
        if parts:
            batch = (
                parts[0]
                if len(parts) == 1
                else pa.concat_tables(parts, promote_options="permissive")
            )
            valid, bad = split_valid(batch)
            if bad.height:
                self.stats.rejected += bad.height
                self.rejects.write(self.table, bad)
            self.stats.rows += valid.height
            for (version,), part in valid.partition_by(
                "_commit_version", as_dict=True, maintain_order=True
            ).items():
                self.next(
                    rows=list(
                        zip(
                            part["date"].to_list(),
                            part["message"].to_list(),
                            part["_diff"].to_list(),
                            strict=True,
                        )
                    ),
                    source=self.table,
                    version=int(version),
                )
        self.stats.versions += len(commits)
        self.next_version = commits[-1].version + 1
        self.stats.latest_version = commits[-1].version

    def _note_finished(self, info: dict) -> None:
        """Bounded mode: remember which producer runs marked themselves finished."""
        if meta(info, "producer.finished"):
            self.stats.finished_runs.add(str(meta(info, "producer.run_id")))
