"""Checkpoints written from the table state a writer already holds: two PUTs, no reads.

delta-rs checkpoints a table by loading it at the due version, reading every commit
since the last checkpoint again and reconciling them on every core; a writer already
holds that state (docs/adr/0013-checkpoints-from-memory.md).

A writer on the fast path (deltabus.delta.append) sees every action of its table: its
own commits, and other writers' commits, which it reads before it retries. It feeds
them to a `CheckpointWriter`, which keeps the table's reconciled state in memory
(deltabus.delta.checkpoint_state) and, at a due version, writes a classic single-part V1
checkpoint from it with pyarrow (the Delta protocol's "Checkpoint Schema", in the types
delta-rs writes), then `_last_checkpoint`; a version that has a checkpoint keeps it (the
PUT is conditional). The state is seeded from storage at the first checkpoint, and again
whenever a version was not fed to it (a gap). A table it does not handle raises
`Unsupported`, and delta-rs writes that checkpoint (deltabus.delta.checkpoints).

Expired log files are deleted by the rule of delta-rs' `cleanup_metadata`, mirrored in
`cleanup_expired_logs`, at the first checkpoint and then at most every `CLEANUP_EVERY_S`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import obstore
import pyarrow as pa
from obstore.exceptions import AlreadyExistsError, PreconditionError

from deltabus.delta.checkpoint_state import (
    DEFAULT_LOG_RETENTION,
    Actions,
    TableState,
    Unsupported,
    config_value,
    parse_interval_ms,
    seed,
    unsupported,
)
from deltabus.delta.lake import Lake
from deltabus.delta.parquet_io import parquet_buffer

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["Actions", "CheckpointWriter", "Unsupported", "Written"]

log = logging.getLogger(__name__)

# Expired log files are looked for at the first checkpoint, then at most this often: a
# LIST of the whole log is not worth doing every ten seconds.
CLEANUP_EVERY_S = 60.0
# Commits fed but not yet checkpointed; past this the writer re-seeds instead.
MAX_PENDING = 10_000
# Live files and tombstones kept in memory at most (~1 KB each as Python dicts); a table
# that grows past this without compaction is checkpointed by delta-rs, which streams.
MAX_FILE_ACTIONS = 200_000
# Log files delta-rs' cleanup deletes, and checkpoints it counts as safe (its regexes).
_CLEANUP_FILE = re.compile(r"(\d{20})\.(json|checkpoint(\.\d+)?\.parquet)$")
_ANY_CHECKPOINT = re.compile(r"_delta_log/(\d{20})\.(checkpoint).*$")


# -- the checkpoint file -------------------------------------------------------------------


def _map(nullable_values: bool = True) -> pa.DataType:
    return pa.map_(pa.string(), pa.field("value", pa.string(), nullable=nullable_values))


def _strings() -> pa.DataType:
    return pa.list_(pa.field("element", pa.string(), nullable=False))


def _f(name: str, type_: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


_DV = pa.struct(
    [
        _f("storageType", pa.string(), False),
        _f("pathOrInlineDv", pa.string(), False),
        _f("offset", pa.int32()),
        _f("sizeInBytes", pa.int32(), False),
        _f("cardinality", pa.int64(), False),
    ]
)
# The columns and types delta-rs writes, minus the V2 `sidecar` column; `remove` without
# `stats` and `tags`, which the Delta protocol leaves out of checkpoints.
CHECKPOINT_SCHEMA = pa.schema(
    [
        _f(
            "add",
            pa.struct(
                [
                    _f("path", pa.string(), False),
                    _f("partitionValues", _map(), False),
                    _f("size", pa.int64(), False),
                    _f("modificationTime", pa.int64(), False),
                    _f("dataChange", pa.bool_(), False),
                    _f("stats", pa.string()),
                    _f("tags", _map()),
                    _f("deletionVector", _DV),
                    _f("baseRowId", pa.int64()),
                    _f("defaultRowCommitVersion", pa.int64()),
                    _f("clusteringProvider", pa.string()),
                ]
            ),
        ),
        _f(
            "remove",
            pa.struct(
                [
                    _f("path", pa.string(), False),
                    _f("deletionTimestamp", pa.int64()),
                    _f("dataChange", pa.bool_(), False),
                    _f("extendedFileMetadata", pa.bool_()),
                    _f("partitionValues", _map()),
                    _f("size", pa.int64()),
                    _f("deletionVector", _DV),
                    _f("baseRowId", pa.int64()),
                    _f("defaultRowCommitVersion", pa.int64()),
                ]
            ),
        ),
        _f(
            "metaData",
            pa.struct(
                [
                    _f("id", pa.string(), False),
                    _f("name", pa.string()),
                    _f("description", pa.string()),
                    _f(
                        "format",
                        pa.struct(
                            [_f("provider", pa.string(), False), _f("options", _map(False), False)]
                        ),
                        False,
                    ),
                    _f("schemaString", pa.string(), False),
                    _f("partitionColumns", _strings(), False),
                    _f("createdTime", pa.int64()),
                    _f("configuration", _map(False), False),
                ]
            ),
        ),
        _f(
            "protocol",
            pa.struct(
                [
                    _f("minReaderVersion", pa.int32(), False),
                    _f("minWriterVersion", pa.int32(), False),
                    _f("readerFeatures", _strings()),
                    _f("writerFeatures", _strings()),
                ]
            ),
        ),
        _f(
            "txn",
            pa.struct(
                [
                    _f("appId", pa.string(), False),
                    _f("version", pa.int64(), False),
                    _f("lastUpdated", pa.int64()),
                ]
            ),
        ),
        _f(
            "domainMetadata",
            pa.struct(
                [
                    _f("domain", pa.string(), False),
                    _f("configuration", pa.string(), False),
                    _f("removed", pa.bool_(), False),
                ]
            ),
        ),
    ]
)


def _checkpoint_protocol(protocol: dict[str, Any]) -> dict[str, Any]:
    """Feature lists as the Delta protocol asks: present from reader 3 / writer 7, else null."""
    reader, writer = int(protocol["minReaderVersion"]), int(protocol["minWriterVersion"])
    return {
        "minReaderVersion": reader,
        "minWriterVersion": writer,
        "readerFeatures": list(protocol.get("readerFeatures") or ()) if reader >= 3 else None,
        "writerFeatures": list(protocol.get("writerFeatures") or ()) if writer >= 7 else None,
    }


def _checkpoint_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    fmt = metadata.get("format") or {}
    return {
        **metadata,
        "format": {
            "provider": fmt.get("provider") or "parquet",
            "options": fmt.get("options") or {},
        },
        "partitionColumns": list(metadata.get("partitionColumns") or ()),
        "configuration": dict(metadata.get("configuration") or {}),
    }


def checkpoint_table(state: TableState) -> tuple[pa.Table, int]:
    """The checkpoint of `state`: one action per row; returns it and its add count."""
    assert state.protocol is not None and state.metadata is not None
    columns: dict[str, list[Any]] = {
        "protocol": [_checkpoint_protocol(state.protocol)],
        "metaData": [_checkpoint_metadata(state.metadata)],
        "txn": list(state.txns.values()),
        "domainMetadata": list(state.domains.values()),
        "add": list(state.files.values()),
        "remove": list(state.tombstones.values()),
    }
    rows = sum(len(v) for v in columns.values())
    arrays = []
    before = 0
    for f in CHECKPOINT_SCHEMA:
        values = columns[f.name]
        after = rows - before - len(values)
        arrays.append(pa.array([None] * before + values + [None] * after, type=f.type))
        before += len(values)
    return pa.Table.from_arrays(arrays, schema=CHECKPOINT_SCHEMA), len(columns["add"])


def parquet_bytes(table: pa.Table) -> bytes:
    return parquet_buffer(table).to_pybytes()


def checkpoint_key(table: str, version: int) -> str:
    """The key of `table`'s classic single-file checkpoint of `version`."""
    return f"{table}/_delta_log/{version:020d}.checkpoint.parquet"


def has_checkpoint(store: Any, table: str, version: int) -> bool:
    """Whether `table` has a classic checkpoint of `version` in `store`."""
    try:
        obstore.head(store, checkpoint_key(table, version))
    except FileNotFoundError:
        return False
    return True


def create_checkpoint_once(lake: Lake, table: str, dt: DeltaTable) -> bool:
    """Checkpoint `dt`'s version with delta-rs unless that version has a checkpoint;
    True when one was written. delta-rs' PUT is unconditional, and a checkpoint replaced
    by one with other bytes fails a reader that listed the first (HTTP 416 on its footer)."""
    if has_checkpoint(lake.object_store, table, dt.version()):
        return False
    dt.create_checkpoint()
    return True


# -- log cleanup ---------------------------------------------------------------------------


def cleanup_expired_logs(store: Any, table: str, keep_version: int, cutoff_ms: int) -> int:
    """Delete expired log files exactly as delta-rs' `cleanup_expired_logs_for` does.

    Versions with a log file modified at or after the cutoff are kept, so `keep_version`
    moves down to the oldest of them; the newest checkpoint at or before it is the safe
    one, and only log files (commits, V1 checkpoints) both older than the cutoff and
    below the safe checkpoint's version are deleted. Returns how many were.
    """
    entries = [
        (m["path"], int(m["last_modified"].timestamp() * 1000))
        for chunk in obstore.list(store, prefix=f"{table}/_delta_log/", chunk_size=1000)
        for m in chunk
    ]
    log_files = []
    for path, modified in entries:
        match = _CLEANUP_FILE.search(path)
        if match:
            log_files.append((path, int(match.group(1)), modified))
    recent = [v for _, v, modified in log_files if modified >= cutoff_ms]
    keep = min([keep_version, *recent])
    safe = [
        int(m.group(1))
        for path, _ in entries
        if (m := _ANY_CHECKPOINT.search(path)) and int(m.group(1)) <= keep
    ]
    if not safe:
        return 0
    doomed = [p for p, v, modified in log_files if v < max(safe) and modified <= cutoff_ms]
    for start in range(0, len(doomed), 1000):
        batch = doomed[start : start + 1000]
        try:
            obstore.delete(store, batch)
        except FileNotFoundError:  # another cleaner got to some first
            for path in batch:
                try:
                    obstore.delete(store, path)
                except FileNotFoundError:
                    pass
    return len(doomed)


# -- the writer ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """One checkpoint this module wrote."""

    version: int
    actions: int
    adds: int
    size: int
    seeded: bool  # the state was (re)loaded from storage for it
    cleaned: int | None  # log files deleted, None when cleanup did not run
    kept: bool = False  # the version had a checkpoint already: nothing was written


class CheckpointWriter:
    """Checkpoints one table from the actions fed to it (see the module docstring).

    `feed` is called by the table's writer for every committed version, in order;
    `write` by the checkpoint thread. A version fed without its actions (a commit made
    through delta-rs) leaves a gap: the next checkpoint seeds the state from storage.
    """

    def __init__(self, lake: Lake, table: str) -> None:
        self.lake = lake
        self.table = table
        self.state: TableState | None = None  # only the checkpoint thread touches it
        self.seeds = 0  # times the state was loaded from storage
        self.follows = False  # the latest version was fed with its actions
        self._pending: list[tuple[int, Actions]] = []
        self._stale = False
        self._lock = threading.Lock()
        self._cleaned_at: float | None = None

    @property
    def store(self) -> Any:
        return self.lake.object_store

    def feed(self, version: int, actions: Actions | None) -> None:
        """`version` was committed with `actions` (None: not known to the caller)."""
        with self._lock:
            if actions is None or len(self._pending) >= MAX_PENDING:
                self._pending.clear()
                self._stale = True
            else:
                self._pending.append((version, actions))
            self.follows = actions is not None

    def reset(self) -> None:
        """Forget the state and the versions fed since (after an error, or for good when
        delta-rs takes over): the next checkpoint from memory seeds from storage."""
        with self._lock:
            self._pending.clear()
            self._stale = True
        self.state = None

    def _state_at(self, version: int) -> tuple[TableState, bool]:
        """The state at `version`: the fed commits applied, or seeded on a gap."""
        with self._lock:
            due = [(v, a) for v, a in self._pending if v <= version]
            self._pending = [(v, a) for v, a in self._pending if v > version]
            stale, self._stale = self._stale, False
        state = None if stale else self.state
        self.state = None  # until it is whole again: an error below means a re-seed
        for v, actions in due:
            if state is None or v <= state.version:
                continue
            if v != state.version + 1:
                log.info(
                    "%s: version %d was not seen, reloading the table state", self.table, v - 1
                )
                state = None
                continue
            state.apply(actions)
            state.version = v
        seeded = state is None or state.version != version
        if seeded:
            state = seed(self.store, self.table, version)
            self.seeds += 1
        assert state is not None
        self.state = state
        return state, seeded

    def write(self, version: int) -> Written:
        """Write the checkpoint of `version`, then `_last_checkpoint`; clean up when due."""
        state, seeded = self._state_at(version)
        assert state.protocol is not None and state.metadata is not None
        reason = unsupported(state.protocol, state.metadata)
        if reason:
            raise Unsupported(reason)
        if len(state.files) + len(state.tombstones) > MAX_FILE_ACTIONS:
            raise Unsupported(f"over {MAX_FILE_ACTIONS} files and tombstones to keep in memory")
        state.expire_tombstones(int(time.time() * 1000))
        table, adds = checkpoint_table(state)
        body = parquet_bytes(table)
        log_dir = f"{self.table}/_delta_log"
        try:
            obstore.put(self.store, checkpoint_key(self.table, version), body, mode="create")
        except (AlreadyExistsError, PreconditionError):
            # Another writer checkpointed this version first (a maintenance pass). Its file
            # stays: replacing it would break a reader between its listing and its reads.
            log.debug("%s: version %d already has a checkpoint, kept", self.table, version)
            return Written(version, table.num_rows, adds, 0, seeded, None, kept=True)
        last = {"version": version, "size": table.num_rows, "sizeInBytes": len(body)}
        last["numOfAddFiles"] = adds
        obstore.put(self.store, f"{log_dir}/_last_checkpoint", json.dumps(last).encode())
        cleaned = self._cleanup(state, version)
        return Written(version, table.num_rows, adds, len(body), seeded, cleaned)

    def _cleanup(self, state: TableState, version: int) -> int | None:
        """Delete expired log files, at the first checkpoint and then every CLEANUP_EVERY_S."""
        assert state.protocol is not None and state.metadata is not None
        now = time.monotonic()
        if self._cleaned_at is not None and now - self._cleaned_at < CLEANUP_EVERY_S:
            return None
        self._cleaned_at = now
        config = state.metadata
        if config_value(config, "delta.enableExpiredLogCleanup", "true").lower() == "false":
            return None
        if "checkpointProtection" in (state.protocol.get("writerFeatures") or ()):
            return None  # that feature's rules for deleting history are not applied here
        retention = parse_interval_ms(
            config_value(config, "delta.logRetentionDuration", DEFAULT_LOG_RETENTION)
        )
        cutoff = int(time.time() * 1000) - retention
        return cleanup_expired_logs(self.store, self.table, version, cutoff)
