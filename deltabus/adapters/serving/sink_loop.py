"""The serving sinks' shared loop: tail `timezone_unified` and hand each run of commits,
with the position it moves, to one target (a PostgreSQL table, an OpenSearch index).

A sink is its own process, a reader of the unified table like any consumer: it reads the
Delta log with `DeltaLogTail` (one GET per poll, paced in step with the ETL's commits by
`Pacer`) and never slows the ETL down or shares its failures. A fresh sink first loads
the table's net content at one version (a snapshot, as Kafka Connect sinks start from a
topic's beginning), then follows the commits after it. A target that goes away
mid-stream is waited out (within DELTABUS_RETRY_MAX_WAIT_S): the sink reconnects, reads
its position back from the target and goes on after it, so a write whose answer was lost
is neither repeated nor skipped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import polars as pl
import pyarrow as pa

from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.bus.pacing import Pacer
from deltabus.bus.tail import Commit, DeltaLogTail
from deltabus.core import health, metrics
from deltabus.core.errors import ConfigError, DeltabusError
from deltabus.core.intervals import DEFAULT_POLL_INTERVAL_MS
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.table_files import concat

log = logging.getLogger(__name__)

COLUMNS = ["message", "timestamp", "time", "diff"]
PROGRESS_EVERY_S = 10.0
T = TypeVar("T")


@dataclass(frozen=True)
class ServeConfig:
    table: str  # the served table, or index: the target's own name for what it keeps
    follow: bool = True  # False: catch up to the unified version current at start, then stop
    poll_interval: float = DEFAULT_POLL_INTERVAL_MS / 1000
    max_versions_per_txn: int = 50
    ready_file: Path | None = None


class PositionMovedError(Exception):
    """Another sink of the same name moved the position: start again from `stored`."""

    def __init__(self, stored: int) -> None:
        super().__init__(f"the position moved to {stored}")
        self.stored = stored


@dataclass
class Applied:
    inserted: int
    deleted: int
    committed_ms: float  # when the changes became visible in the target (epoch ms)
    escaped: int = 0  # of the rows inserted, those stored in an escaped form
    already_applied: int = 0  # changes the target already held (a replay after a crash)


class SinkTarget(Protocol):
    """Where a sink keeps the unified table's net content, and its position with it."""

    system: str  # "PostgreSQL", "OpenSearch": for log lines

    def describe(self) -> str:
        """What is served where, never a secret."""
        ...

    def open(self, checked: bool = True) -> None:
        """Connect and prepare; `checked`: a problem is one clear error (at start),
        otherwise the client's errors pass through to be retried."""
        ...

    def close(self) -> None: ...

    def connected(self) -> bool: ...

    def position(self) -> int:
        """The last unified version applied (-1: none yet)."""
        ...

    def snapshot_version(self, latest: int) -> int:
        """The unified version a fresh sink loads its snapshot from."""
        ...

    def count(self) -> int:
        """The rows (documents) served."""
        ...

    def changes(self, rows: pa.Table | None) -> pl.DataFrame:
        """What a run of unified rows changes, in the form `apply` takes."""
        ...

    def apply(
        self, changes: pl.DataFrame, expected: int, to_version: int, source_commit_ms: int
    ) -> Applied:
        """Apply `changes` and move the position from `expected` to `to_version`; raises
        PositionMovedError when another sink moved it."""
        ...

    def submit(
        self,
        changes: pl.DataFrame,
        expected: int,
        to_version: int,
        source_commit_ms: int,
        done: Callable[[Applied], None],
    ) -> None:
        """`apply`, possibly beside earlier batches still in flight: `done` gets the
        Applied once the position moved. A failure may surface at a later call."""
        ...

    def check(self) -> None:
        """Raise the failure of a batch in flight that has ended since the last call."""
        ...

    def drain(self) -> None:
        """Wait until every batch submitted has moved the position, or raise its failure."""
        ...

    def recreated_hint(self) -> str:
        """How to start over when the unified table was re-created under the sink."""
        ...

    def is_transient(self, exc: BaseException) -> bool:
        """True for a failure an outage of the target explains."""
        ...

    def user_error(self, exc: BaseException) -> DeltabusError | None:
        """The one clear error for a failure a user must fix, or None."""
        ...

    def redact(self, text: str) -> str:
        """`text` without the target's secrets."""
        ...


class SinkLoop(ABC):
    """One sink process's loop over one target (see the module docstring); subclasses
    count what was applied into their report."""

    def __init__(
        self,
        lake: Lake,
        target: SinkTarget,
        config: ServeConfig,
        stop: threading.Event | None = None,
    ) -> None:
        self.lake = lake
        self.config = config
        self.stop = stop or threading.Event()
        self.target = target
        self.position = -1
        self.unified_version = -1  # the newest unified version the sink knows of
        self.reconnects = 0
        self._last_progress = time.monotonic()

    # -- what subclasses report -----------------------------------------------------------

    @abstractmethod
    def _snapshot_loaded(self, applied: Applied, version: int) -> None: ...

    @abstractmethod
    def _commits_applied(self, applied: Applied, commits: list[Commit]) -> None: ...

    @abstractmethod
    def _finished(self, served: int | None, elapsed_s: float) -> None: ...

    @abstractmethod
    def _progress_line(self) -> str: ...

    # -- the loop -------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until stopped (follow) or caught up to the version current at start."""
        started = time.monotonic()
        self.target.open(checked=True)  # wrong password, no server: one clear error, now
        ok = False
        try:
            if not self._wait_for_unified():
                self._finish(started)
                return
            self.position = self._retry_target(self.target.position, "read the sink position")
            latest = retry_storage(
                lambda: self.lake.open(UNIFIED_TABLE).version(), what="open timezone_unified"
            )
            self.unified_version = latest
            if self.position > latest:
                raise ConfigError(
                    f"{self.target.describe()} is at version {self.position} of "
                    f"{self.lake.uri(UNIFIED_TABLE)}, which only has {latest}: the unified "
                    "table was re-created",
                    self.target.recreated_hint(),
                )
            while self.position < 0 and not self.stop.is_set():
                self._snapshot(
                    self._retry_target(
                        lambda: self.target.snapshot_version(latest), "record the snapshot"
                    )
                )
            log.info(
                "serving %s into %s from version %d",
                UNIFIED_TABLE,
                self.target.describe(),
                self.position + 1,
            )
            self._follow(latest)
            ok = True
        finally:
            if not ok:
                self.target.close()
        self._finish(started)

    def _finish(self, started: float) -> None:
        try:
            self._drain()
            served = self._retry_target(self.target.count, "count what is served")
        finally:
            self.target.close()
        self._finished(served, round(time.monotonic() - started, 3))

    def _wait_for_unified(self) -> bool:
        announced = False
        while not retry_storage(
            lambda: self.lake.exists(UNIFIED_TABLE), what="look for timezone_unified"
        ):
            if not self.config.follow:
                raise ConfigError(
                    f"{self.lake.uri(UNIFIED_TABLE)} does not exist: nothing to serve",
                    "run the ETL first (deltabus etl), or use --follow to wait for it",
                )
            if not announced:
                log.info("waiting for %s to be created", self.lake.uri(UNIFIED_TABLE))
                announced = True
            if self.stop.wait(max(self.config.poll_interval, 0.2)):
                return False
        return True

    def _follow(self, latest: int) -> None:
        tail = DeltaLogTail(self.lake, UNIFIED_TABLE, columns=COLUMNS)
        retry_storage(lambda: tail.start(self.position + 1), what="read timezone_unified's state")
        self._ready()
        pacer = Pacer(self.lake, UNIFIED_TABLE, self.config.poll_interval, self.stop)
        limit = self.config.max_versions_per_txn
        while not self.stop.is_set():
            upto = None if self.config.follow else latest
            if upto is not None and self.position >= upto:
                if self._guarded(self.target.drain):
                    return
                continue  # a batch in flight failed: its commits are read again
            commits = self._fetch(tail, limit, upto, pacer)
            pacer.found(len(commits), commits[-1].timestamp_ms if commits else None)
            if commits:
                self._apply(tail, commits)
                self._progress()
                if len(commits) == limit:
                    continue  # behind: read on at once
            elif not self.config.follow:
                if self._guarded(self.target.drain):
                    return
                continue
            elif not self._guarded(self.target.check):
                continue
            pacer.wait()

    def _drain(self) -> None:
        """Wait for the batches in flight, recovering from a failure as `_apply` does,
        until the target holds every batch the loop applied."""
        while not self._guarded(self.target.drain):
            pass

    def _fetch(
        self, tail: DeltaLogTail, limit: int, upto: int | None, pacer: Pacer
    ) -> list[Commit]:
        """The commits that have landed after the position (at most `limit`)."""
        commits: list[Commit] = []
        while len(commits) < limit:
            version = self.position + 1 + len(commits)
            if upto is not None and version > upto:
                break
            commit = retry_storage(lambda v=version: tail.commit(v), what="poll timezone_unified")
            if commit is None:
                break
            commits.append(commit)
            if not pacer.next_landed(commit.timestamp_ms):
                break  # the next one is not due yet: no GET that would find nothing
        if commits:
            self.unified_version = max(self.unified_version, commits[-1].version)
        return commits

    # -- applying -------------------------------------------------------------------------

    def _snapshot(self, version: int) -> None:
        """A fresh sink: the net content at `version`, applied as one change."""
        dt = retry_storage(
            lambda: self.lake.open(UNIFIED_TABLE, version=version), what="open timezone_unified"
        )
        rows = retry_storage(lambda: dt.to_pyarrow_table(columns=COLUMNS), what="read snapshot")
        rows = rows.append_column(
            "_commit_version", pa.array([version] * rows.num_rows, pa.int64())
        )
        changes = self.target.changes(rows)
        try:
            applied = self.target.apply(changes, -1, version, _commit_ms(dt))
        except PositionMovedError as moved:
            self.position = moved.stored  # another sink loaded it: follow from there
            return
        except Exception as exc:
            if not self.target.is_transient(exc):
                raise
            self._reconnect(exc)  # the position says whether the snapshot landed
            return
        self.position = version
        self._snapshot_loaded(applied, version)
        log.info(
            "loaded %d rows of version %d into %s",
            applied.inserted,
            version,
            self.target.describe(),
        )

    def _apply(self, tail: DeltaLogTail, commits: list[Commit]) -> None:
        parts = [
            rows
            for c in commits
            if (rows := retry_storage(lambda c=c: tail.rows(c), what="read timezone_unified"))
        ]
        changes = self.target.changes(concat(parts) if parts else None)
        last = commits[-1]

        def done(applied: Applied) -> None:
            who = metrics.component()
            metrics.RECORDS.labels(who, self.config.table, "out").inc(
                applied.inserted + applied.deleted
            )
            metrics.COMMITS.labels(who, self.config.table).inc()
            self._commits_applied(applied, commits)

        if self._guarded(
            lambda: self.target.submit(
                changes, self.position, last.version, last.timestamp_ms, done
            )
        ):
            self.position = last.version  # the next batch follows this one

    def _guarded(self, call: Callable[[], None]) -> bool:
        """`call` into the target; False when it raised a moved position or an outage,
        after which `self.position` is the target's own and the commits after it are
        read again."""
        try:
            call()
        except PositionMovedError as moved:
            log.warning(
                "the position of %s moved to %d (another sink of the same name?): going on "
                "from there",
                self.target.describe(),
                moved.stored,
            )
            self.position = moved.stored
            return False
        except Exception as exc:
            if not self.target.is_transient(exc):
                raise
            self._reconnect(exc)
            return False
        return True

    def _reconnect(self, exc: BaseException) -> None:
        """The target went away mid-write: reconnect and go on after the position it
        holds (the lost write either landed, and the position says so, or did not, and
        its commits are read again)."""
        text = str(exc).strip()
        log.warning(
            "%s unavailable (%s); reconnecting",
            self.target.system,
            self.target.redact(text.splitlines()[0] if text else type(exc).__name__),
        )
        self.reconnects += 1
        self.target.close()
        before = self.position
        self.position = self._retry_target(
            self.target.position, f"reconnect to {self.target.system}"
        )
        log.info(
            "reconnected to %s: position %d (%s)",
            self.target.describe(),
            self.position,
            "the last write had landed" if self.position > before else "going on",
        )

    def _retry_target(self, fn: Callable[[], T], what: str) -> T:
        """`fn` against the target, waiting out an outage within the retry budget
        (reconnecting before each attempt when the connection was lost)."""

        def attempt() -> T:
            if not self.target.connected():
                self.target.open(checked=False)
            try:
                return fn()
            except Exception as exc:
                if self.target.is_transient(exc):
                    self.target.close()
                raise

        try:
            return retry_storage(attempt, what=what, transient=self.target.is_transient)
        except Exception as exc:
            error = self.target.user_error(exc)
            if error is None:
                raise
            raise error from None

    # -- reporting ------------------------------------------------------------------------

    def _ready(self) -> None:
        health.mark_ready()
        path = self.config.ready_file
        if path is not None:  # written whole, then renamed: a reader never sees half of it
            tmp = Path(f"{path}.tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "position": self.position}))
            tmp.replace(path)

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        log.info("served up to version %d: %s", self.position, self._progress_line())


def _commit_ms(dt) -> int:  # noqa: ANN001 - a DeltaTable
    history = dt.history(1)
    return int(history[0].get("timestamp", 0)) if history else 0
