"""Retention: a table's old records removed by dropping whole data files, as Kafka deletes
old log segments (`retention.ms`, `retention.bytes`).

A file's age is its add action's `modificationTime`: when its records were committed (a
compacted file takes the newest of its inputs' times). By time, every live file older
than `max_age_s` is dropped; by size, the oldest files are dropped until the table's live
files hold at most `max_bytes` (files of the same millisecond go together). Only whole
files are dropped: a file that holds one record young enough is kept with all of its
records.

The drop is one commit of `remove` actions with `dataChange: false`, claimed beside live
writers the way compaction commits (deltabus.delta.compaction.commit_beside). Readers of
the change data feed, and deltabus' tails, get no rows from it: it deletes nothing they
have to retract. The bytes stay in storage until vacuum deletes the removed files, once
they are older than the deleted-file retention.

The commit records the oldest version retention keeps, as the app transaction
`deltabus.retention` (carried in every checkpoint) and in its commit info: every version
from it on has all of its records in live files; a consumer whose position is below it
has lost records (`oldest_version` reads it back). It is found in the log: the first
version committed after the newest dropped file's time, then past every version up to
`COMMIT_DELAY_S` later that still added a dropped file (a writer may commit a file a
while after writing it).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from deltabus.core.errors import ConfigError
from deltabus.core.errors import RetentionConflict as RetentionConflict
from deltabus.core.retry import retry_storage
from deltabus.core.version import __version__
from deltabus.delta.append import eligible, protocol_and_metadata
from deltabus.delta.compaction import commit_beside
from deltabus.delta.lake import Lake
from deltabus.delta.snapshots import DeltaLog, parse_actions

log = logging.getLogger(__name__)

RETENTION_APP_ID = "deltabus.retention"  # app transaction: the oldest version kept
TOKEN_KEY = "deltabus.retention"  # in the retention commit's commit info
OLDEST_VERSION_KEY = "deltabus.retention.oldest_version"
CUTOFF_KEY = "deltabus.retention.cutoff_ms"
OPERATION = "RETENTION"
# How long after writing a data file a writer may commit it (an append retried through a
# short outage): the versions committed that long after the cutoff are read to find any
# that still added a dropped file.
COMMIT_DELAY_S = 60.0
READ_CONCURRENCY = 16
PLAN_ATTEMPTS = 3


@dataclass(frozen=True)
class RetentionPolicy:
    """How much of a table to keep: records younger than `max_age_s` seconds, and at most
    `max_bytes` of live files; None: no limit of that kind."""

    max_age_s: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_age_s", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"retention {name} must be a positive integer, got {value!r}")

    @property
    def limited(self) -> bool:
        return self.max_age_s is not None or self.max_bytes is not None


@dataclass(frozen=True)
class Retained:
    """What one retention pass did to a table.

    `version`: the retention commit (None: nothing was dropped); `oldest_version`: the
    oldest version retention keeps (0: every version); `skipped`: why the table was not
    looked at (a table this module does not write), else None.
    """

    table: str
    version: int | None
    files_removed: int
    bytes_removed: int
    files_kept: int
    bytes_kept: int
    oldest_version: int
    cutoff_ms: int | None = None
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _File:
    path: str
    size: int
    written_ms: int


def apply_retention(
    lake: Lake,
    table: str,
    policy: RetentionPolicy,
    *,
    now_ms: int | None = None,
    dt: DeltaTable | None = None,
) -> Retained:
    """Drop `table`'s files that `policy` no longer keeps, in one commit beside live
    writers.

    Args:
        lake: the lake.
        table: the table's name under the lake root.
        policy: the age and size limits.
        now_ms: the time ages are measured against (default: now).
        dt: the table, loaded (default: loaded here).

    Returns:
        What was dropped and kept, and the oldest version kept.

    Raises:
        RetentionConflict: other commits removed the planned files or changed the schema
            on every one of `PLAN_ATTEMPTS` plans; nothing was committed.
    """
    for attempt in range(PLAN_ATTEMPTS):
        if dt is None or attempt:
            dt = retry_storage(lambda: lake.open(table), what=f"load {table}")
        try:
            return _apply_once(lake, table, policy, dt, now_ms)
        except RetentionConflict as exc:
            if attempt == PLAN_ATTEMPTS - 1:
                raise
            log.info("retention of %s planned again: %s", table, exc)
    raise AssertionError("unreachable")


def _apply_once(
    lake: Lake, table: str, policy: RetentionPolicy, dt: DeltaTable, now_ms: int | None
) -> Retained:
    read_version = dt.version()
    kept_before = dt.transaction_version(RETENTION_APP_ID) or 0
    files = _live_files(dt)
    reason = _unsupported(table, dt, files)
    if reason is not None or not policy.limited:
        total = sum(f.size for f in files)
        return Retained(table, None, 0, 0, len(files), total, kept_before, skipped=reason)
    dropped = _chosen(files, policy, int(time.time() * 1000) if now_ms is None else now_ms)
    kept = [f for f in files if f.path not in {d.path for d in dropped}]
    kept_bytes = sum(f.size for f in kept)
    if not dropped:
        return Retained(table, None, 0, 0, len(kept), kept_bytes, kept_before)
    cutoff = max(f.written_ms for f in dropped)
    oldest = max(kept_before, _oldest_kept(lake, table, kept_before, read_version, cutoff))
    token = uuid.uuid4().hex
    body = _commit_body(policy, dropped, read_version, oldest, cutoff, token)
    version = commit_beside(
        lake,
        table,
        read_version,
        body,
        token=token,
        token_key=TOKEN_KEY,
        relied_on={f.path for f in dropped},
        conflict=RetentionConflict,
        what="retention",
    )
    removed = sum(f.size for f in dropped)
    log.info(
        "retention of %s: version %d dropped %d file(s), %d bytes; oldest version kept %d",
        table,
        version,
        len(dropped),
        removed,
        oldest,
    )
    return Retained(table, version, len(dropped), removed, len(kept), kept_bytes, oldest, cutoff)


def _live_files(dt: DeltaTable) -> list[_File]:
    actions = pa.table(dt.get_add_actions(flatten=True))
    columns = ("path", "size_bytes", "modification_time")
    paths, sizes, written = (actions.column(c).to_pylist() for c in columns)
    return [_File(p, int(s), int(w)) for p, s, w in zip(paths, sizes, written, strict=True)]


def _unsupported(table: str, dt: DeltaTable, files: list[_File]) -> str | None:
    """Why this module does not drop files of `dt` (None: it does): the same tables it
    does not compact (deltabus.delta.compaction), whose removes need more than a path."""
    protocol, metadata = protocol_and_metadata(dt)
    reason = eligible(protocol, metadata)
    if reason is None and "deletionVectors" in (protocol.get("writerFeatures") or ()):
        reason = "deletion vectors"
    if reason is None and any(quote(f.path) != f.path for f in files):
        reason = "file names that need escaping"
    if reason is not None:
        log.warning("retention does not drop files of %s: %s", table, reason)
    return reason


def _chosen(files: list[_File], policy: RetentionPolicy, now_ms: int) -> list[_File]:
    """The files `policy` drops, oldest first."""
    ordered = sorted(files, key=lambda f: (f.written_ms, f.path))
    dropped: list[_File] = []
    if policy.max_age_s is not None:
        horizon = now_ms - policy.max_age_s * 1000
        dropped = [f for f in ordered if f.written_ms < horizon]
    if policy.max_bytes is not None:
        total = sum(f.size for f in ordered[len(dropped) :])
        n = len(dropped)
        while total > policy.max_bytes and n < len(ordered):
            total -= ordered[n].size
            n += 1
        if n > len(dropped):  # files of the same millisecond go together
            newest = ordered[n - 1].written_ms
            while n < len(ordered) and ordered[n].written_ms == newest:
                n += 1
            dropped = ordered[:n]
    return dropped


def _timestamp(actions: dict[str, list[dict[str, Any]]]) -> int | None:
    info = (actions.get("commitInfo") or [{}])[0]
    stamp = info.get("inCommitTimestamp", info.get("timestamp"))
    if stamp is not None:
        return int(stamp)
    written = [
        int(a["modificationTime"]) for a in actions.get("add", ()) if "modificationTime" in a
    ]
    return max(written) if written else None


def _adds_written_by(actions: dict[str, list[dict[str, Any]]], cutoff_ms: int) -> bool:
    """True when the commit added records (dataChange) in a file written by `cutoff_ms`."""
    return any(
        a.get("dataChange", True) and int(a.get("modificationTime", cutoff_ms + 1)) <= cutoff_ms
        for a in actions.get("add", ())
    )


def _oldest_kept(lake: Lake, table: str, since: int, read_version: int, cutoff_ms: int) -> int:
    """The oldest version whose records all stay once the files written by `cutoff_ms`
    are dropped: after every version that added such a file (see the module)."""
    delta_log = DeltaLog(lake.object_store, table)

    def actions(version: int) -> dict[str, list[dict[str, Any]]] | None:
        raw = retry_storage(lambda: delta_log.commit(version), what=f"read {table}'s log")
        return None if raw is None else parse_actions(raw)

    def older(version: int) -> bool:  # expired from the log, or committed by the cutoff
        found = actions(version)
        stamp = None if found is None else _timestamp(found)
        return stamp is None or stamp <= cutoff_ms

    lo, hi = since, read_version + 1
    while lo < hi:  # the first version committed after the cutoff
        mid = (lo + hi) // 2
        if older(mid):
            lo = mid + 1
        else:
            hi = mid
    oldest = lo
    horizon = cutoff_ms + int(COMMIT_DELAY_S * 1000)
    with ThreadPoolExecutor(READ_CONCURRENCY) as pool:
        start = lo
        while start <= read_version:
            versions = range(start, min(start + READ_CONCURRENCY, read_version + 1))
            for version, found in zip(versions, pool.map(actions, versions), strict=True):
                if found is None:
                    continue
                stamp = _timestamp(found)
                if stamp is not None and stamp > horizon:
                    return oldest
                if _adds_written_by(found, cutoff_ms):
                    oldest = version + 1
            start += READ_CONCURRENCY
    return oldest


def _commit_body(
    policy: RetentionPolicy,
    dropped: list[_File],
    read_version: int,
    oldest: int,
    cutoff_ms: int,
    token: str,
) -> bytes:
    now = int(time.time() * 1000)
    info = {
        TOKEN_KEY: token,
        OLDEST_VERSION_KEY: oldest,
        CUTOFF_KEY: cutoff_ms,
        "timestamp": now,
        "operation": OPERATION,
        "operationParameters": {
            "retentionMs": "none" if policy.max_age_s is None else str(policy.max_age_s * 1000),
            "retentionBytes": "none" if policy.max_bytes is None else str(policy.max_bytes),
        },
        "readVersion": read_version,
        "isBlindAppend": False,
        "engineInfo": f"deltabus/{__version__}",
        "clientVersion": f"deltabus-{__version__}",
        "operationMetrics": {
            "numRemovedFiles": str(len(dropped)),
            "numRemovedBytes": str(sum(f.size for f in dropped)),
        },
    }
    txn = {"appId": RETENTION_APP_ID, "version": oldest, "lastUpdated": now}
    removes = [
        {
            "path": f.path,
            "deletionTimestamp": now,
            "dataChange": False,
            "extendedFileMetadata": True,
            "partitionValues": {},
            "size": f.size,
        }
        for f in dropped
    ]
    lines = [{"commitInfo": info}, {"txn": txn}, *({"remove": r} for r in removes)]
    return "\n".join(json.dumps(line, separators=(",", ":")) for line in lines).encode()


def oldest_version(lake: Lake, table: str) -> int:
    """The oldest version of `table` retention keeps (0: it never dropped a file).

    Read from the newest checkpoint's app transactions and the commits after it: one GET
    of `_last_checkpoint`, the checkpoint, and one per later commit; no listing.
    """
    delta_log = DeltaLog(lake.object_store, table)

    def read() -> int:
        found, start = 0, 0
        for attempt in range(3):  # a checkpoint replaced and cleaned up while being read
            hint = delta_log.last_checkpoint()
            if hint is None or int(hint.get("version", -1)) < 0:
                break
            start = int(hint["version"]) + 1
            try:
                found = _checkpoint_txn(delta_log, delta_log.checkpoint_files(start - 1, hint))
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        version = start
        while True:
            raw = delta_log.commit(version)
            if raw is None:
                return found
            for txn in parse_actions(raw).get("txn", ()):
                if txn.get("appId") == RETENTION_APP_ID:
                    found = int(txn["version"])
            version += 1

    return retry_storage(read, what=f"read the retention of {table}")


def _checkpoint_txn(delta_log: DeltaLog, names: list[str]) -> int:
    """The `deltabus.retention` app transaction in a checkpoint (0: none)."""
    found = 0
    for name in names:
        raw = delta_log.read(name)
        if raw is None:
            raise FileNotFoundError(f"{delta_log.dir}/{name}")
        if name.endswith(".json"):
            txns = parse_actions(raw).get("txn", [])
        else:
            parquet = pq.ParquetFile(pa.BufferReader(pa.py_buffer(raw)))
            if "txn" not in parquet.schema_arrow.names:
                continue
            txns = [t for t in parquet.read(columns=["txn"]).column("txn").to_pylist() if t]
        for txn in txns:
            if txn.get("appId") == RETENTION_APP_ID:
                found = int(txn["version"])
    return found
