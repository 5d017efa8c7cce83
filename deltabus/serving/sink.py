"""The PostgreSQL serving sink: tail `timezone_unified`, apply each run of commits to the
served table in one transaction with the sink's position (deltabus.serving.target).

It is its own process, a reader of the unified table like any consumer: it reads the
Delta log with `DeltaLogTail` (one GET per poll, paced in step with the ETL's commits by
`Pacer`) and never slows the ETL down or shares its failures. A fresh sink first loads
the table's current net content in one transaction (a snapshot, as Kafka Connect sinks
start from a topic's beginning), then follows the commits after it. PostgreSQL going
away mid-stream is waited out (within DELTABUS_RETRY_MAX_WAIT_S): the sink reconnects,
reads its position back and goes on after it, so a COMMIT whose answer was lost is
neither repeated nor skipped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

from deltabus.delta_protocol import concat
from deltabus.errors import ConfigError
from deltabus.intervals import DEFAULT_POLL_INTERVAL_MS
from deltabus.lake import UNIFIED_TABLE, Lake
from deltabus.pacing import Pacer
from deltabus.retry import retry_storage
from deltabus.serving import pg
from deltabus.serving.target import DEFAULT_TABLE, PositionMovedError, PostgresTarget, net_changes
from deltabus.tail import Commit, DeltaLogTail

log = logging.getLogger(__name__)

COLUMNS = ["message", "timestamp", "time", "diff"]
PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class ServeConfig:
    table: str = DEFAULT_TABLE
    follow: bool = True  # False: catch up to the unified version current at start, then stop
    poll_interval: float = DEFAULT_POLL_INTERVAL_MS / 1000
    max_versions_per_txn: int = 50
    ready_file: Path | None = None


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


class PostgresSink:
    """One sink process's loop (see the module docstring)."""

    def __init__(
        self, lake: Lake, dsn: str, config: ServeConfig, stop: threading.Event | None = None
    ) -> None:
        self.lake = lake
        self.config = config
        self.stop = stop or threading.Event()
        self.target = PostgresTarget(dsn, config.table, source=lake.uri(UNIFIED_TABLE))
        self.report = ServeReport(
            served_table=config.table, postgres=pg.describe(dsn), source=lake.uri(UNIFIED_TABLE)
        )
        self.position = -1
        self._last_progress = time.monotonic()

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> ServeReport:
        started = time.monotonic()
        self.target.open(checked=True)  # wrong password, no server: one clear error, now
        ok = False
        try:
            if not self._wait_for_unified():
                return self._finish(started)
            self.position = self._retry_pg(self.target.position, "read the sink position")
            latest = retry_storage(
                lambda: self.lake.open(UNIFIED_TABLE).version(), what="open timezone_unified"
            )
            self.report.unified_version = latest
            if self.position > latest:
                raise ConfigError(
                    f"{self.target.describe()} is at version {self.position} of "
                    f"{self.lake.uri(UNIFIED_TABLE)}, which only has {latest}: the unified "
                    "table was re-created",
                    "drop the served table and its row in deltabus_sink_position to serve "
                    "the new table from its start",
                )
            while self.position < 0 and not self.stop.is_set():
                self._snapshot(latest)
            log.info(
                "serving %s into %s from version %d",
                UNIFIED_TABLE,
                self.target.describe(),
                self.position + 1,
            )
            self._follow(latest)
            ok = True
        finally:
            self.report.version = self.position
            if not ok:
                self.target.close()
        return self._finish(started)

    def _finish(self, started: float) -> ServeReport:
        try:
            self.report.served_rows = self._retry_pg(self.target.count, "count the served rows")
        finally:
            self.target.close()
        self.report.elapsed_s = round(time.monotonic() - started, 3)
        return self.report

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
                return
            commits = self._fetch(tail, limit, upto, pacer)
            pacer.found(len(commits), commits[-1].timestamp_ms if commits else None)
            if commits:
                self._apply(tail, commits)
                self._progress()
                if len(commits) == limit:
                    continue  # behind: read on at once
            elif not self.config.follow:
                return
            pacer.wait()

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
            self.report.unified_version = max(self.report.unified_version, commits[-1].version)
        return commits

    # -- applying -------------------------------------------------------------------------

    def _snapshot(self, version: int) -> None:
        """A fresh sink: the net content at `version`, in one transaction."""
        dt = retry_storage(
            lambda: self.lake.open(UNIFIED_TABLE, version=version), what="open timezone_unified"
        )
        rows = retry_storage(lambda: dt.to_pyarrow_table(columns=COLUMNS), what="read snapshot")
        rows = rows.append_column(
            "_commit_version", pa.array([version] * rows.num_rows, pa.int64())
        )
        changes = net_changes(rows)
        try:
            applied = self.target.apply(changes, -1, version, _commit_ms(dt))
        except PositionMovedError as moved:
            self.position = moved.stored  # another sink loaded it: follow from there
            return
        except Exception as exc:
            if not pg.is_transient(exc):
                raise
            self._reconnect(exc)  # the position says whether the snapshot landed
            return
        self.position = version
        self.report.snapshot_rows = applied.inserted
        self.report.rows_escaped += applied.escaped
        self.report.transactions += 1
        log.info(
            "loaded %d rows of version %d into a fresh served table", applied.inserted, version
        )

    def _apply(self, tail: DeltaLogTail, commits: list[Commit]) -> None:
        parts = [
            rows
            for c in commits
            if (rows := retry_storage(lambda c=c: tail.rows(c), what="read timezone_unified"))
        ]
        changes = net_changes(concat(parts) if parts else None)
        last = commits[-1]
        try:
            applied = self.target.apply(changes, self.position, last.version, last.timestamp_ms)
        except PositionMovedError as moved:
            log.warning(
                "the position of %s moved to %d (another sink of the same name?): going on "
                "from there",
                self.target.describe(),
                moved.stored,
            )
            self.position = moved.stored
            return
        except Exception as exc:
            if not pg.is_transient(exc):
                raise
            self._reconnect(exc)
            return
        self.position = last.version
        r = self.report
        r.transactions += 1
        r.versions += len(commits)
        r.rows_upserted += applied.inserted
        r.rows_deleted += applied.deleted
        r.rows_escaped += applied.escaped
        r.lag_s = round(max(0.0, applied.committed_ms - last.timestamp_ms) / 1000, 3)

    def _reconnect(self, exc: BaseException) -> None:
        """PostgreSQL went away mid-transaction: reconnect and go on after the position
        it holds (the lost transaction either committed, and the position says so, or
        did not, and its commits are read again)."""
        log.warning(
            "PostgreSQL unavailable (%s); reconnecting",
            pg.redact(
                str(exc).strip().splitlines()[0] if str(exc).strip() else "", self.target.dsn
            ),
        )
        self.report.reconnects += 1
        self.target.close()
        before = self.position
        self.position = self._retry_pg(self.target.position, "reconnect to PostgreSQL")
        log.info(
            "reconnected to %s: position %d (%s)",
            self.target.describe(),
            self.position,
            "the last transaction had committed" if self.position > before else "going on",
        )

    def _retry_pg(self, fn, what: str):  # noqa: ANN001, ANN202
        """`fn` against PostgreSQL, waiting out an outage within the retry budget
        (reconnecting before each attempt when the connection was lost)."""

        def attempt():  # noqa: ANN202
            if self.target.con is None or self.target.con.closed:
                self.target.open(checked=False)
            try:
                return fn()
            except Exception as exc:
                if pg.is_transient(exc):
                    self.target.close()
                raise

        try:
            return retry_storage(attempt, what=what, transient=pg.is_transient)
        except Exception as exc:
            error = pg.user_error(exc, self.target.dsn)
            if error is None:
                raise
            raise error from None

    # -- reporting ------------------------------------------------------------------------

    def _ready(self) -> None:
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
        r = self.report
        log.info(
            "served up to version %d: %d transactions, %d rows upserted, %d deleted, "
            "last lag %.3f s",
            self.position,
            r.transactions,
            r.rows_upserted,
            r.rows_deleted,
            r.lag_s,
        )


def _commit_ms(dt) -> int:  # noqa: ANN001 - a DeltaTable
    history = dt.history(1)
    return int(history[0].get("timestamp", 0)) if history else 0
