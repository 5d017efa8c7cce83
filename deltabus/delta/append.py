"""Blind appends to a Delta table in two PUTs: the data file, then the commit.

`TableAppender` writes an Arrow batch as one Parquet file, then claims the next version
with a conditional PUT of `_delta_log/<v+1>.json`; when another writer took it, it reads
the commits that landed (GET until a 404) and tries again on top of them. Appends do not
conflict with appends; a commit that changes the protocol or the metadata sends the table
back to delta-rs. Exactly once as with delta-rs: an answer lost in an outage is found by
reading the log for the writer's (app id, seq) before the retry. Every version written or
read goes to the table's `BackgroundCheckpointer` once an append passed one.

Tables this cannot append (`eligible`: partition columns, constraints, column mapping,
...) are appended by delta-rs (`append_once`). Why not delta-rs' commit path for every
append: docs/adr/0050-appends-in-two-puts.md.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError
from obstore.exceptions import AlreadyExistsError, PreconditionError

from deltabus.core import hedge, metrics
from deltabus.core.errors import VersionTakenError as VersionTakenError
from deltabus.core.retry import retry_storage
from deltabus.core.version import __version__
from deltabus.delta.checkpoints import NO_POST_COMMIT_HOOKS, BackgroundCheckpointer
from deltabus.delta.lake import Lake
from deltabus.delta.parquet_io import parquet_buffer
from deltabus.delta.snapshots import NEXT_DATA_FILE, parse_actions
from deltabus.delta.tables import is_commit_conflict

log = logging.getLogger(__name__)

# Writer features an append honours by writing plain `add` actions (no extra fields).
APPEND_SAFE_FEATURES = frozenset(
    {
        "appendOnly",
        "changeDataFeed",
        "deletionVectors",
        "domainMetadata",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "typeWidening",
        "typeWidening-preview",
        "checkpointProtection",
    }
)
# Field metadata that asks a writer to compute or check values.
_WRITER_FIELD_KEYS = ("delta.invariants", "delta.generationExpression", "delta.identity")
_STAT_TYPES = (pa.types.is_integer, pa.types.is_floating)


def eligible(protocol: dict[str, Any], metadata: dict[str, Any]) -> str | None:
    """None when a plain append honours the table's protocol; else why not."""
    writer = int(protocol.get("minWriterVersion", 1))
    features = set(protocol.get("writerFeatures") or ())
    if writer >= 7 and not features <= APPEND_SAFE_FEATURES:
        return f"writer features {sorted(features - APPEND_SAFE_FEATURES)}"
    if writer in (5, 6):
        return f"writer version {writer} (column mapping / identity columns)"
    if metadata.get("partitionColumns"):
        return "partition columns"
    config = metadata.get("configuration") or {}
    for key, value in config.items():
        if key.startswith("delta.constraints."):
            return f"check constraint {key}"
        if key in ("delta.enableRowTracking", "delta.enableInCommitTimestamps"):
            if str(value).lower() == "true":
                return key
        if key == "delta.columnMapping.mode" and str(value).lower() != "none":
            return "column mapping"
    schema = json.loads(metadata.get("schemaString") or '{"fields": []}')
    for field in schema.get("fields", []):
        if any(k in (field.get("metadata") or {}) for k in _WRITER_FIELD_KEYS):
            return f"column {field.get('name')} has invariants or generated values"
    return None


def protocol_and_metadata(dt: DeltaTable) -> tuple[dict[str, Any], dict[str, Any]]:
    """The protocol and metadata of a delta-rs handle, as log actions."""
    p, m = dt.protocol(), dt.metadata()
    protocol: dict[str, Any] = {
        "minReaderVersion": p.min_reader_version,
        "minWriterVersion": p.min_writer_version,
    }
    if p.writer_features:
        protocol["writerFeatures"] = list(p.writer_features)
    metadata = {
        "partitionColumns": list(m.partition_columns),
        "configuration": dict(m.configuration),
        "schemaString": dt.schema().to_json(),
    }
    return protocol, metadata


def file_stats(table: pa.Table) -> str:
    """The `stats` of an add action: row and null counts, min/max of numeric columns.

    String bounds are left out: the protocol lets a writer omit any bound, and truncated
    string bounds are easy to get wrong; readers then just do not skip on them.
    """
    stats: dict[str, Any] = {"numRecords": table.num_rows, "nullCount": {}}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        stats["nullCount"][name] = column.null_count
        if not table.num_rows or not any(t(column.type) for t in _STAT_TYPES):
            continue
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            continue
        bounds = pc.min_max(column)
        if bounds["min"].is_valid:
            lo[name], hi[name] = bounds["min"].as_py(), bounds["max"].as_py()
    if lo:
        stats["minValues"], stats["maxValues"] = lo, hi
    return json.dumps(stats, separators=(",", ":"))


class TableAppender:
    """Appends to one table from a known version; falls back to delta-rs when it must.

    Quacks like the part of a delta-rs handle that fencing and resuming read:
    `version()`, `transaction_version(app_id)` and `history(limit)`.
    """

    def __init__(self, lake: Lake, table: str, dt: DeltaTable) -> None:
        self.lake = lake
        self.table = table
        self.dt = dt
        self.store = lake.object_store
        self._version = dt.version()
        self._txns: dict[str, int] = {}  # app transactions committed after `dt`'s version
        self._base: dict[str, int | None] = {}  # app transactions as of `dt`'s version
        # Told about every version this appender writes or reads, with its actions.
        self.checkpointer: BackgroundCheckpointer | None = None
        self.protocol, self.metadata = protocol_and_metadata(dt)
        self._next_name = data_file_name()
        self.reason = eligible(self.protocol, self.metadata)
        if self.reason:
            log.info("%s is appended by delta-rs: %s", table, self.reason)

    @property
    def fast(self) -> bool:
        return self.reason is None

    def version(self) -> int:
        return self._version

    def transaction_version(self, app_id: str) -> int | None:
        """The newest version of `app_id` in the table as far as this appender has read."""
        seen = self._txns.get(app_id)
        base = self._base_transaction(app_id)
        if seen is None:
            return base
        return seen if base is None else max(seen, base)

    def _base_transaction(self, app_id: str) -> int | None:
        """`app_id`'s version in `dt`, read through the handle once and then remembered.

        The handle is pinned at the version it was loaded at, and delta-rs replays that
        version's log files on every read. Another process's log cleanup may have removed
        them (a checkpoint made them expendable); the table is then loaded afresh from its
        newest checkpoint, whose versions are newer and so still correct lower bounds.
        """
        if app_id in self._base:
            return self._base[app_id]
        try:
            value = self.dt.transaction_version(app_id)
        except DeltaError as exc:
            log.info("reloading %s: its handle's log files are unreadable (%s)", self.table, exc)
            self.dt = self.lake.open(self.table)
            self._base.clear()
            value = self.dt.transaction_version(app_id)
        self._base[app_id] = value
        return value

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Commit infos newest first (delta-rs, from a handle brought up to date)."""
        self.dt.update_incremental()
        self._base.clear()
        return self.dt.history(limit)

    # -- reading what other writers committed -------------------------------------------

    def _log_path(self, version: int) -> str:
        return f"{self.table}/_delta_log/{version:020d}.json"

    def refresh(self) -> int:
        """Read commits after our version (GET until a 404); returns how many landed."""
        if not self.fast:
            before = self._version
            self.dt.update_incremental()
            self._version, self._txns, self._base = self.dt.version(), {}, {}
            return self._version - before
        landed = 0
        while True:
            try:
                raw = hedge.get(self.store, self._log_path(self._version + 1))
            except FileNotFoundError:
                return landed
            actions = parse_actions(raw)
            if self.checkpointer is not None:
                self.checkpointer.committed(self._version + 1, actions)
            for txn in actions.get("txn", ()):
                app, v = str(txn["appId"]), int(txn["version"])
                self._txns[app] = max(v, self._txns.get(app, v))
            if actions.get("protocol"):
                self.protocol = actions["protocol"][-1]
            if actions.get("metaData"):
                self.metadata = actions["metaData"][-1]
            if actions.get("protocol") or actions.get("metaData"):
                self.reason = eligible(self.protocol, self.metadata)
            self._version += 1
            landed += 1

    # -- writing ------------------------------------------------------------------------

    def _put_data(self, data: pa.Table) -> dict[str, Any]:
        body = parquet_buffer(data)
        name, self._next_name = self._next_name, data_file_name()
        hedge.put_new(self.store, f"{self.table}/{name}", body.to_pybytes())
        return {
            "path": name,
            "partitionValues": {},
            "size": body.size,
            "modificationTime": int(time.time() * 1000),
            "dataChange": True,
            "stats": file_stats(data),
        }

    def _commit_body(
        self, add: dict[str, Any] | None, transactions: dict[str, int], custom: dict[str, str]
    ) -> tuple[bytes, dict[str, list[dict[str, Any]]]]:
        """The commit file, and its actions as `parse_actions` would read them back
        (without the commit info, which checkpoints do not keep). No rows (`add` None):
        a commit of its app transactions only, with no data file."""
        now = int(time.time() * 1000)
        info: dict[str, Any] = {
            "timestamp": now,
            "operation": "WRITE",
            "operationParameters": {"mode": "Append"},
            "isBlindAppend": True,
            "engineInfo": f"deltabus/{__version__}",
            "clientVersion": f"deltabus-{__version__}",
            "operationMetrics": {
                "numFiles": "1" if add else "0",
                "numOutputRows": str(add_rows(add)) if add else "0",
            },
            # The name this appender's next data file will have: a tail may fetch it
            # together with the next commit (deltabus.bus.tail).
            NEXT_DATA_FILE: self._next_name,
            **custom,
        }
        txns = [{"appId": app, "version": v, "lastUpdated": now} for app, v in transactions.items()]
        lines = [{"commitInfo": info}, *({"txn": txn} for txn in txns)]
        lines += [{"add": add}] if add else []
        body = "\n".join(json.dumps(line, separators=(",", ":")) for line in lines).encode()
        return body, {"txn": txns, "add": [add] if add else []}

    def append_once(
        self,
        data: pa.Table,
        *,
        app_id: str,
        seq: int,
        custom_metadata: dict[str, str],
        what: str,
        markers: dict[str, int] | None = None,
        checkpointer: BackgroundCheckpointer | None = None,
        fence: Callable[[Any], None] | None = None,
    ) -> bool:
        """Append `data` as commit `seq` of writer `app_id`, exactly once (see
        `append_once`, whose contract this keeps). Returns False when the commit
        had already landed. A table that needs more than a plain append, or that another
        writer changed so, is appended by delta-rs. Counted in the process's metrics."""
        request = _Append(data, app_id, seq, custom_metadata, what, markers, checkpointer, fence)
        if checkpointer is not None:
            self.checkpointer = checkpointer
        started = time.monotonic()
        landed = self._append(request)
        if landed:
            who = metrics.component()
            metrics.COMMIT_SECONDS.labels(who).observe(time.monotonic() - started)
            metrics.COMMITS.labels(who, self.table).inc()
            if data.num_rows:
                metrics.RECORDS.labels(who, self.table, "out").inc(data.num_rows)
                metrics.BYTES.labels(who, self.table, "out").inc(data.nbytes)
        return landed

    def _append(self, request: _Append) -> bool:
        if self.fast:
            try:
                return self._fast_append_once(request)
            except _NotEligible:
                log.info("%s is appended by delta-rs from now on: %s", self.table, self.reason)
        return self._append_once(request)

    def _append_once(self, r: _Append) -> bool:
        if self.dt.version() < self._version:
            retry_storage(self.dt.update_incremental, what=f"load {self.table}")
        fence = r.fence
        if r.checkpointer:
            previous = self.dt
            self.dt = r.checkpointer.refreshed(self.dt)
            if fence is not None and self.dt is not previous:
                # The fresh handle may include a newer claim (reading it may touch
                # storage, so an outage is waited out like any storage call).
                dt = self.dt
                retry_storage(lambda: fence(dt), what=f"check the writer of {self.table}")
        landed = append_once(
            self.dt,
            r.data,
            app_id=r.app_id,
            seq=r.seq,
            custom_metadata=r.custom_metadata,
            what=r.what,
            markers=r.markers,
            checkpointer=r.checkpointer,
            fence=fence,
        )
        self._version, self._txns, self._base = self.dt.version(), {}, {}
        return landed

    def _fast_append_once(self, r: _Append) -> bool:
        transactions = {r.app_id: r.seq, **(r.markers or {})}
        attempts = 0
        add: dict[str, Any] | None = None

        def attempt() -> bool:
            nonlocal attempts, add
            attempts += 1
            if attempts > 1:
                self.refresh()
                if r.fence is not None:
                    r.fence(self)
                done = self.transaction_version(r.app_id)
                if done is not None and done >= r.seq:
                    return False
                if not self.fast:
                    raise _NotEligible(self.reason)
            if add is None and r.data.num_rows:  # written once, whatever the retries
                add = self._put_data(r.data)
            body, actions = self._commit_body(add, transactions, r.custom_metadata)
            try:
                hedge.put_new(self.store, self._log_path(self._version + 1), body)
            except (AlreadyExistsError, PreconditionError) as exc:
                raise VersionTakenError(f"{self.table} version {self._version + 1}") from exc
            self._version += 1
            for app, v in transactions.items():
                self._txns[app] = v
            if r.checkpointer:
                r.checkpointer.committed(self._version, actions)
            return True

        return retry_storage(
            attempt, what=r.what, also_retry=lambda e: isinstance(e, VersionTakenError)
        )


@dataclass(frozen=True)
class _Append:
    """One `append_once` call, handed to whichever path commits it."""

    data: pa.Table
    app_id: str
    seq: int
    custom_metadata: dict[str, str]
    what: str
    markers: dict[str, int] | None
    checkpointer: BackgroundCheckpointer | None
    fence: Callable[[Any], None] | None


class _NotEligible(Exception):
    """Another writer changed the table so that a plain append no longer honours it."""


def data_file_name() -> str:
    """A fresh data file name, unique to this append."""
    return f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"


def add_rows(add: dict[str, Any]) -> int:
    return int(json.loads(add["stats"])["numRecords"])


def append_once(
    dt: DeltaTable,
    data: pa.Table,
    *,
    app_id: str,
    seq: int,
    custom_metadata: dict[str, str],
    what: str,
    markers: dict[str, int] | None = None,
    checkpointer: BackgroundCheckpointer | None = None,
    fence: Callable[[DeltaTable], None] | None = None,
) -> bool:
    """Append `data` as commit `seq` of writer `app_id`, exactly once.

    Args:
        dt: the table, loaded (it is brought up to date before a retry).
        data: the rows, in the table's schema.
        app_id: the writer's stable name; its positions live in the table as the Delta
            app transaction of that id.
        seq: this batch's number, strictly increasing per `app_id` across restarts.
        custom_metadata: string pairs recorded in the commit info.
        what: what is being written, for the error raised when retries run out.
        markers: further app transactions committed atomically with the rows.
        checkpointer: hands checkpoints and log cleanup to a background thread.
        fence: raises when this writer was fenced by a newer one.

    Returns:
        True when this call committed the rows; False when (app_id, seq) was already in
        the log (an earlier attempt landed), and nothing was written.

    Raises:
        StorageError: the lake failed past the retry budget, or a failure no retry can
            cure (access denied, read-only or full store).

    Example:
        `append_once(dt, batch, app_id="orders-writer", seq=42, custom_metadata={}, what="orders")`

    The commit carries the app transaction (app_id, seq). Before every retry the log
    is re-read: if (app_id, seq) is already there (an earlier attempt landed but its
    answer was lost in an outage) nothing is written. The first attempt skips that
    round trip: nothing of `seq` can be in the log before it. delta-rs' own commit retries are
    off so that a lost answer can never turn into a second commit of the same rows;
    conflicts with other writers are retried here, after that check. `markers` are
    further app transactions (name -> integer) committed atomically with the rows: they
    live in the table state (and its checkpoints), so they outlast the commit metadata
    when old log files expire. With a `checkpointer` the commit skips delta-rs'
    inline checkpoint and log cleanup and hands them to it (callers commit with
    `checkpointer.refreshed(dt)`, which swaps in a handle loaded after the checkpoint).
    `fence` is called with the re-read table before every retry and raises when this
    writer has been fenced (deltabus.bus.fence): only then does "(app_id, seq) is
    already there" prove that the earlier attempt landed, rather than another writer
    of the same app id having taken the slot.
    Returns False when the commit had already landed.
    """
    props = CommitProperties(
        custom_metadata=custom_metadata,
        app_transactions=[
            Transaction(app_id, seq),
            *(Transaction(name, value) for name, value in (markers or {}).items()),
        ],
        max_commit_retries=0,
    )

    attempts = 0

    def attempt() -> bool:
        nonlocal attempts
        attempts += 1
        if attempts > 1:
            dt.update_incremental()
            if fence is not None:
                fence(dt)
            done = dt.transaction_version(app_id)
            if done is not None and done >= seq:
                return False
        write_deltalake(
            dt,
            data,
            mode="append",
            commit_properties=props,
            post_commithook_properties=NO_POST_COMMIT_HOOKS if checkpointer else None,
        )
        if checkpointer:
            checkpointer.committed(dt.version())
        return True

    return retry_storage(attempt, what=what, also_retry=is_commit_conflict)
