"""Tail a Delta table by reading its log directly: one GET per poll, no snapshot upkeep.

A poll GETs `_delta_log/<version>.json`; a missing file means the version has not landed
yet (why not delta-rs' snapshots and change data feed:
docs/adr/0031-tail-reads-the-log-directly.md). Every commit is
read as the protocol says (deltabus.delta.reader_features, table_schema, change_plan):
an unsupported reader version or feature raises before anything of that version is
returned; partition columns and column mapping are honoured; a commit that deletes or
updates rows yields them as retractions (`_diff` -1), and one whose changes cannot be
told from the log raises `ChangeWithoutCdfError`, or is skipped when asked to. A data
file that cannot be read as Parquet raises `UnreadableFileError` naming the table, the
version and the file, or is left out (logged and counted) when asked to; a storage
outage is raised as it is, for the caller's retries. Files added with `dataChange:
false` (compaction) carry no new rows and are skipped. A plain append costs one GET of
the commit and one read per added file.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from deltabus.core import hedge, metrics
from deltabus.core.errors import (
    ChangeWithoutCdfError,
    DeltabusError,
    InputTableError,
    StorageError,
    user_storage_error,
)
from deltabus.core.errors import UnreadableFileError as UnreadableFileError
from deltabus.core.retry import is_transient
from deltabus.delta.change_plan import FilePart, plan_changes
from deltabus.delta.lake import Lake
from deltabus.delta.snapshots import NEXT_DATA_FILE, DeltaLog, Snapshot, parse_actions, snapshot_at
from deltabus.delta.table_files import TableFiles, concat
from deltabus.delta.table_schema import TableState

log = logging.getLogger(__name__)

# Log entries a tail may have in flight ahead of the one it reads (`read_ahead`), and the
# largest data file it fetches beside them (larger ones are read when their rows are).
READ_AHEAD_MAX = 8
READ_AHEAD_FILE_BYTES = 8 * 1024 * 1024
# A tail that finds no next commit checks this often whether it was expired instead: a
# reader that lagged past the log retention (days) learns it within half a minute.
EXPIRY_CHECK_S = 30.0


def unreadable(exc: BaseException) -> bool:
    """True when reading a file failed because of the file's bytes: pyarrow's and
    Parquet's errors (`ArrowException`, an `OSError` such as "Couldn't deserialize
    thrift"), not an outage, a missing file or a storage failure a user must fix."""
    if not isinstance(exc, pa.ArrowException | OSError) or isinstance(exc, FileNotFoundError):
        return False
    return not is_transient(exc) and user_storage_error(exc) is None


def _reason(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass
class Commit:
    """One landed version: its commit info and the file parts whose rows it changed."""

    version: int
    info: dict[str, Any]
    state: TableState | None = None
    parts: list[FilePart] = field(default_factory=list)
    change: bool = False  # deletes or updates rows (not only appends)
    skipped: str | None = None  # why its changes were skipped (DELTABUS_SKIP_CHANGE_COMMITS)
    # A schema change that alters how existing rows read: (state before, columns).
    reread: tuple[TableState, list[str]] | None = None

    @property
    def timestamp_ms(self) -> int:
        return int(self.info.get("inCommitTimestamp", self.info.get("timestamp", 0)))

    @property
    def operation(self) -> str:
        return str(self.info.get("operation") or "unknown operation")


class DeltaLogTail:
    """Reads the commits of one table from a version on, as they land.

    One GET of the next log entry per poll; a commit's added rows (and, with the change
    data feed, its retractions) come back as one Arrow table.

    Args:
        lake: the lake holding the table.
        table: the table's name under the lake root.
        columns: the logical columns to read (None: all).
        skip_change_commits: skip a commit whose deleted rows the log cannot name.
        skip_corrupt_files: leave out a data file that cannot be read as Parquet.

    Example:
        `tail = DeltaLogTail(lake, "timezone_unified"); tail.start(0); tail.commit(0)`

    `columns` limits the logical columns read. With `skip_change_commits`, a commit
    whose deleted rows cannot be told from the log is skipped whole (counted in
    `skipped_change_commits`) instead of raising `ChangeWithoutCdfError`. With
    `skip_corrupt_files`, a file that cannot be read as Parquet is left out of its
    commit's rows (logged, and counted once per version and file in `skipped_files`)
    instead of raising `UnreadableFileError`.
    """

    def __init__(
        self,
        lake: Lake,
        table: str,
        columns: list[str] | None = None,
        *,
        skip_change_commits: bool = False,
        skip_corrupt_files: bool = False,
    ) -> None:
        self.table = table
        self.columns = columns
        store = lake.object_store
        self.log = DeltaLog(store, table)
        self.files = TableFiles(store, table, lake.root)
        self.skip_change_commits = skip_change_commits
        self.skipped_change_commits = 0
        self.skip_corrupt_files = skip_corrupt_files
        self.skipped_files = 0
        self._skipped: set[tuple[int, str]] = set()  # (version, path) counted already
        self.state: TableState | None = None  # in force before version `_next`
        self._next: int | None = None
        self._expiry_checked = 0.0
        self._store = store
        # (version, file): the data file the writer of the version before said its next
        # commit adds (deltabus.delta.append); on a remote store it is fetched together
        # with that commit, saving a round trip.
        self._announced: tuple[int, str] | None = None
        self.fetched_ahead = 0  # commits whose data file came with the commit's GET
        # Log entries sent ahead of their read (`read_ahead`), by version.
        self._log_ahead: dict[int, Future[bytes | None]] = {}
        self.read_ahead_hits = 0  # commits that came from a read ahead

    # -- table state ---------------------------------------------------------------------

    def start(self, version: int) -> None:
        """Load the protocol and metadata in force before `version`, and check them.

        Raises `UnsupportedFeatureError` when the table needs a reader feature the tail
        does not implement, so a tail refuses a table before reading any of its rows.
        """
        state = self._state_before(version) if version > 0 else None
        if state is not None:
            state.check(self.table, version - 1)
        self.state, self._next = state, version
        self._log_ahead.clear()
        self.files.forget_ahead()

    def read_ahead(self, first: int, count: int) -> None:
        """Send the GETs of log entries `first` .. `first + count - 1` now (at most
        `READ_AHEAD_MAX` in flight), so that a tail that is behind reads several versions
        in the time of one round trip; on a local store it does nothing. An entry found
        missing ahead is read again when asked for: it may have landed since."""
        if self._store is None or not hedge.remote(self._store):
            return
        for version in range(first, first + count):
            if len(self._log_ahead) >= READ_AHEAD_MAX:
                break
            if version not in self._log_ahead:
                self._log_ahead[version] = self.log.commit_later(version)

    def _read_log(self, version: int) -> bytes | None:
        """The log entry of `version`: from a read ahead when one was sent, else one GET."""
        for stale in [v for v in self._log_ahead if v < version]:
            del self._log_ahead[stale]
        ahead = self._log_ahead.pop(version, None)
        if ahead is not None:
            try:
                raw = ahead.result()
            except Exception:  # noqa: BLE001 - read again below, raising what it raises
                raw = None
            if raw is not None:
                self.read_ahead_hits += 1
                return raw
        return self.log.commit(version)

    def _state_before(self, version: int) -> TableState:
        snapshot = snapshot_at(self.log, version - 1)
        if snapshot is not None and snapshot.state is not None:
            return snapshot.state
        return self._state_before_expired(version)

    def _state_before_expired(self, version: int) -> TableState:
        """The log before `version` has expired: use the oldest checkpoint after it.

        Its protocol and metadata are the ones in force before `version` unless a
        commit from `version` up to that checkpoint changed them.
        """
        later = sorted(v for v in self.log.checkpoints() if v >= version)
        if not later:
            raise InputTableError(
                f"cannot tell the schema of {self.table} before version {version}: the "
                "log before it is gone and no checkpoint follows",
                "check that the table was not deleted and re-created; otherwise the rows "
                "of this table must be reprocessed from an empty timezone_unified",
            )
        snapshot = Snapshot(version=later[0])
        snapshot.apply(
            self.log.checkpoint_actions(self.log.checkpoint_files(later[0], None), False)
        )
        for v in range(version, later[0] + 1):
            raw = self.log.commit(v)
            actions = parse_actions(raw) if raw is not None else {}
            if raw is None or actions.get("metaData") or actions.get("protocol"):
                raise InputTableError(
                    f"cannot tell the schema of {self.table} before version {version}: the "
                    f"log before it expired and version {v} "
                    + ("is missing" if raw is None else "changed the schema or protocol"),
                    "the rows of this table must be reprocessed from an empty timezone_unified",
                )
        state = snapshot.state
        if state is None:
            raise InputTableError(
                f"checkpoint {later[0]} of {self.table} has no protocol or metadata",
                "check the table's _delta_log",
            )
        return state

    # -- commits ------------------------------------------------------------------------

    def _check_not_expired(self, version: int) -> None:
        """A missing log file is either in the future or expired: tell them apart.

        Log files behind a checkpoint and older than the table's log retention are
        deleted. If the last checkpoint is at or past `version` and the log file is still
        missing, this reader lagged more than the retention and the rows of that commit
        can no longer be tailed: stop loudly rather than skip them. The second look tells
        a version that landed (and was checkpointed) since the first read from one that
        expired. Checked at most every EXPIRY_CHECK_S, it costs one GET (at 5 s, half a
        request per second of an idle pipeline's five).
        """
        now = time.monotonic()
        if now - self._expiry_checked < EXPIRY_CHECK_S:
            return
        self._expiry_checked = now
        raw = self.log.read("_last_checkpoint")
        if raw is None:
            return
        try:
            checkpoint = int(json.loads(raw)["version"])
        except (ValueError, KeyError, TypeError):
            # Read while a writer replaced it (object stores overwrite it in place, and a
            # ranged read can mix two versions): look again at the next check.
            self._expiry_checked = 0.0
            return
        if checkpoint >= version:
            if self.log.commit(version) is not None:
                self._expiry_checked = 0.0  # it landed after the caller's read: not expired
                return
            raise StorageError(
                f"{self.table} version {version} expired from the Delta log before it was "
                f"read (checkpoint at {checkpoint}): this reader lagged more than the "
                "table's log retention",
                "raise DELTABUS_LOG_RETENTION_S (delta.logRetentionDuration) above the "
                "longest reader outage; the rows of the expired versions must be "
                "reprocessed from the table itself",
            )

    def commit(self, version: int) -> Commit | None:
        """The commit of `version`, or None when it has not landed yet.

        Raises `UnsupportedFeatureError` if it needs a reader feature the tail does not
        implement, and `ChangeWithoutCdfError` if it deletes rows the log cannot name
        (unless skipping such commits); then nothing of this version is returned.
        """
        ahead = self._fetch_announced(version)
        raw = self._read_log(version)
        if raw is None:
            self._check_not_expired(version)
            return None
        actions = parse_actions(raw)
        self._take_announced(version, actions, ahead)
        if self._log_ahead:  # behind: fetch this version's files beside the next entries
            self._fetch_files_later(actions)
        if self._next != version:
            self.start(version)
        before = self.state
        state = before
        if actions.get("protocol") or actions.get("metaData"):
            protocol = actions["protocol"][-1] if actions.get("protocol") else None
            metadata = actions["metaData"][-1] if actions.get("metaData") else None
            protocol = protocol or (before.protocol if before else None)
            metadata = metadata or (before.metadata if before else None)
            if protocol is None or metadata is None:
                raise InputTableError(
                    f"{self.table} version {version} is not a valid Delta commit: no "
                    "protocol or metadata in force",
                    "check the table's _delta_log",
                )
            state = TableState(protocol, metadata)
            state.check(self.table, version)
        commit = Commit(version=version, info=(actions.get("commitInfo") or [{}])[0], state=state)
        plan = plan_changes(actions, state)
        if plan.parts and state is None:
            raise InputTableError(
                f"{self.table} version {version} adds data before any metadata",
                "check the table's _delta_log",
            )
        if before is not None and state is not before and actions.get("metaData"):
            changed = before.reads_existing_rows_differently(state)  # type: ignore[arg-type]
            if changed:
                commit.reread = (before, changed)
        commit.parts, commit.change = plan.parts, plan.change
        if plan.unresolvable:
            if not self.skip_change_commits:
                raise ChangeWithoutCdfError(
                    f"{self.table} version {version} ({commit.operation}) changes rows the "
                    f"log cannot name: {plan.unresolvable}",
                    "turn the table's change data feed on (ALTER TABLE ... SET "
                    "TBLPROPERTIES (delta.enableChangeDataFeed = true)) before deleting, "
                    "updating or merging, and reprocess this table's rows from an empty "
                    "timezone_unified; or set DELTABUS_SKIP_CHANGE_COMMITS=true to skip "
                    "such commits whole (their rows then stay as they were in "
                    "timezone_unified). The ETL stopped before this version and wrote "
                    "nothing of it; its position is kept",
                )
            self.skipped_change_commits += 1
            commit.skipped = plan.unresolvable
            commit.parts = []
            log.warning(
                "%s version %d (%s) skipped (DELTABUS_SKIP_CHANGE_COMMITS): %s; "
                "%d change commit(s) skipped so far",
                self.table,
                version,
                commit.operation,
                plan.unresolvable,
                self.skipped_change_commits,
            )
        self.state, self._next = state, version + 1
        return commit

    def _fetch_files_later(self, actions: dict[str, Any]) -> None:
        """Send the GETs of the small data files a commit adds now, so that reading a
        window of commits costs about one round trip, not one per file."""
        for add in actions.get("add") or []:
            size = add.get("size")
            if add.get("dataChange", True) and not add.get("deletionVector") and size:
                if int(size) <= READ_AHEAD_FILE_BYTES:
                    self.files.fetch_later(add["path"])

    def _fetch_announced(self, version: int) -> Future[bytes] | None:
        """A GET of the data file announced for `version`, sent now, on a remote store."""
        announced = self._announced
        if announced is None or announced[0] != version or self._store is None:
            return None
        if not hedge.remote(self._store):
            return None
        return hedge.get_later(self._store, f"{self.table}/{announced[1]}")

    def _take_announced(
        self, version: int, actions: dict[str, Any], ahead: Future[bytes] | None
    ) -> None:
        """Hand the file fetched ahead to the reader when `version` adds exactly it, and
        note the file this version announces for the next one."""
        expected = self._announced[1] if self._announced and self._announced[0] == version else None
        info = (actions.get("commitInfo") or [{}])[0]
        following = info.get(NEXT_DATA_FILE)
        self._announced = (version + 1, following) if isinstance(following, str) else None
        adds = actions.get("add") or []
        if ahead is None or len(adds) != 1 or adds[0].get("path") != expected:
            return
        try:
            data = ahead.result()
        except Exception:  # noqa: BLE001 - the file is then read as usual
            return
        self.files.fetched_ahead(str(expected), data)
        self.fetched_ahead += 1

    def rows(self, commit: Commit) -> pa.Table | None:
        """The rows `commit` changed: data columns, `_diff` (+1 inserted, -1 deleted),
        `_commit_version` and `_commit_timestamp`; None when it changed none.

        Raises `UnreadableFileError` for a file that cannot be read as Parquet (unless
        skipping those); then nothing of this version is returned.
        """
        where = f"{self.table} version {commit.version}"
        parts: list[pa.Table | None] = []
        if commit.reread is not None:
            parts.extend(self._reread(commit, where))
        if commit.parts:
            assert commit.state is not None
            for part in commit.parts:
                parts.append(self._part_rows(commit.state, part, commit.version))
        parts = [p for p in parts if p is not None and p.num_rows]
        if not parts:
            return None
        table = concat(parts)
        n = table.num_rows
        metrics.RECORDS.labels(metrics.component(), self.table, "in").inc(n)
        metrics.BYTES.labels(metrics.component(), self.table, "in").inc(table.nbytes)
        if commit.change or commit.reread is not None:
            diff = table.column("_diff").to_numpy()
            log.info(
                "%s version %d (%s): %d row(s) inserted, %d retracted",
                self.table,
                commit.version,
                commit.operation,
                int((diff > 0).sum()),
                int((diff < 0).sum()),
            )
        return table.append_column(
            "_commit_version", pa.repeat(pa.scalar(commit.version, pa.int64()), n)
        ).append_column(
            "_commit_timestamp",
            pa.array(np.full(n, commit.timestamp_ms, np.int64)).cast(pa.timestamp("ms")),
        )

    def _part_rows(self, state: TableState, part: FilePart, version: int) -> pa.Table | None:
        """The rows of one part; None for an unreadable file that is skipped."""
        where = f"{self.table} version {version}"
        try:
            return self.files.part_rows(state, part, where, self.columns)
        except DeltabusError:
            raise
        except Exception as exc:
            if not unreadable(exc):
                raise
            path = str(part.action.get("path"))
            kind = "change data file" if part.kind == "cdc" else "data file"
            if not self.skip_corrupt_files:
                raise UnreadableFileError(
                    f"{where}: {kind} {path} cannot be read as Parquet (corrupt, truncated "
                    f"or not Parquet): {_reason(exc)}",
                    "replace the file with an intact copy, or remove it from the table with "
                    f"a new commit (e.g. restore {self.table} to version {version - 1}); "
                    "or start the ETL with --on-corrupt-file skip to leave such "
                    "files out (each is logged and counted as skipped_files in the ETL "
                    "report; its rows never reach timezone_unified). The ETL stopped "
                    "before this version and wrote nothing of it; its position in "
                    f"{self.table} is kept, so the next start resumes right here",
                ) from None
            if (version, path) not in self._skipped:
                self._skipped.add((version, path))
                self.skipped_files += 1
                log.warning(
                    "%s: %s %s skipped (--on-corrupt-file skip): it cannot be read as "
                    "Parquet (%s); its rows are left out; %d file(s) skipped so far",
                    where,
                    kind,
                    path,
                    _reason(exc),
                    self.skipped_files,
                )
            return None

    def _reread(self, commit: Commit, where: str) -> list[pa.Table | None]:
        """Every live row as read before the schema change (retracted) and after it
        (inserted again): rows whose reading did not change cancel out."""
        before, changed = commit.reread  # type: ignore[misc]
        assert commit.state is not None
        snapshot = snapshot_at(self.log, commit.version - 1, files=True)
        if snapshot is None or snapshot.files is None:
            raise InputTableError(
                f"{where} changes how existing rows read (columns {changed}), and the "
                "files of the version before it are no longer in the log",
                "reprocess this table's rows from an empty timezone_unified",
            )
        log.warning(
            "%s changes how existing rows read (columns %s): re-reading %d file(s)",
            where,
            changed,
            len(snapshot.files),
        )
        out = []
        for action in snapshot.files.values():
            dv = action.get("deletionVector")
            out.append(self._part_rows(before, FilePart("live", action, -1, dv=dv), commit.version))
            out.append(
                self._part_rows(commit.state, FilePart("live", action, 1, dv=dv), commit.version)
            )
        return out
