"""A Pathway input that tails one Delta table: the loop every deltabus Pathway source runs.

Each poll reads the next commit of the table's log (deltabus.bus.tail): one GET, which
also says whether the version has landed. Polls are paced by the writer's clock, or by
the store's commit notifications when it streams them (deltabus.bus.pacing). A tail that
is behind reads up to `max_versions_per_read` commits at a time and reads on at once.

A version the tail cannot read correctly (an unsupported reader feature, rows deleted
without change data, a data file that is not Parquet) raises a `DeltabusError` from the
connector's thread after the commits before it were emitted and before anything of it
is, so the program stops with its position before that version; `error` keeps it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pathway as pw

from deltabus.bus.pacing import Pacer, read_landed
from deltabus.bus.tail import Commit, DeltaLogTail
from deltabus.core.errors import DeltabusError, StorageError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import NOT_DELTA_GRACE_S, Lake

log = logging.getLogger(__name__)


class TableTail(pw.io.python.ConnectorSubject):
    """Tails Delta table `table` from `start_version` on and hands every run of landed
    commits, in version order, to `emit`.

    Subclasses implement `emit` (send rows with `self.next`, then `self.commit` unless
    something else commits the input) and may override `resumed` (called once the
    protocol in force at the start is checked) and `finished` (True ends the read once
    no commit is waiting). `next_version` is the first version not yet emitted.

    Args:
        lake: the lake holding the table.
        table: the table's name under the lake's prefix; the tail waits for it to exist.
        start_version: the first version to emit.
        poll_interval: seconds between polls after a miss (deltabus.bus.pacing).
        stop: set to end the read after the current run of commits.
        columns: the data columns to read (all when None).
        max_versions_per_read: the most commits handed to one `emit`.
        on_start: called when the thread starts, before the table is looked for.
        skip_change_commits: skip commits that remove rows without change data.
        skip_corrupt_files: leave out data files that cannot be read as Parquet.
    """

    def __init__(
        self,
        lake: Lake,
        table: str,
        start_version: int,
        *,
        poll_interval: float,
        stop: threading.Event,
        columns: list[str] | None = None,
        max_versions_per_read: int = 50,
        on_start: Callable[[], None] | None = None,
        skip_change_commits: bool = False,
        skip_corrupt_files: bool = False,
    ) -> None:
        super().__init__(datasource_name=f"delta:{table}")
        self.lake = lake
        self.table = table
        self.next_version = start_version
        self.poll_interval = poll_interval
        self.stop = stop
        self.columns = columns
        self.max_versions_per_read = max_versions_per_read
        self.on_start = on_start
        self.skip_change_commits = skip_change_commits
        self.skip_corrupt_files = skip_corrupt_files
        self.error: DeltabusError | None = None

    @property
    def _deletions_enabled(self) -> bool:
        return False  # rows carry their own `diff`; the engine never retracts a key

    def emit(self, tail: DeltaLogTail, commits: list[Commit]) -> None:
        """Send `commits` (landed, consecutive, at least one); raising sends none of a
        version the tail refuses."""
        raise NotImplementedError

    def resumed(self) -> None:
        """Called once the protocol and schema in force at `start_version` are checked."""

    def finished(self) -> bool:
        """True when a bounded read is complete; checked when no commit is waiting."""
        return False

    def run(self) -> None:
        try:
            self._run()
        except DeltabusError as exc:
            self.error = exc
            raise

    def _run(self) -> None:
        if self.on_start:
            self.on_start()
        if not self._wait_for_table():
            return
        tail = DeltaLogTail(
            self.lake,
            self.table,
            self.columns,
            skip_change_commits=self.skip_change_commits,
            skip_corrupt_files=self.skip_corrupt_files,
        )
        # The protocol and schema in force where we resume: an unsupported one stops here.
        retry_storage(
            lambda: tail.start(self.next_version), what=f"read the protocol of {self.table}"
        )
        self.resumed()
        pacer = Pacer(self.lake, self.table, self.poll_interval, self.stop)
        while not self.stop.is_set():
            commits, refused = read_landed(
                tail, pacer, self.next_version, self.max_versions_per_read, f"poll {self.table}"
            )
            pacer.found(len(commits), commits[-1].timestamp_ms if commits else None)
            if commits:
                self.emit(tail, commits)
                self.next_version = commits[-1].version + 1
            if refused is not None:
                raise refused  # the versions before it are sent; nothing of it is
            if len(commits) == self.max_versions_per_read:
                continue  # behind: read on right away
            if not commits and self.finished():
                log.info("input %s finished at version %d", self.table, self.next_version - 1)
                return
            pacer.wait()

    def _wait_for_table(self) -> bool:
        """Wait for the table; files without a Delta log for long are an error.

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
                return True
            if not announced:
                log.info(
                    "waiting for input table %s at %s to be created",
                    self.table,
                    self.lake.uri(self.table),
                )
                announced = True
            self.stop.wait(max(self.poll_interval, 0.2))
        return False
