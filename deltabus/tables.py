"""Table contracts (docs/reference/tables.md) as Arrow schemas, and creating tables that
honour them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from deltabus.checkpoints import NO_POST_COMMIT_HOOKS, BackgroundCheckpointer
from deltabus.lake import Lake
from deltabus.retry import retry_storage

INPUT_SCHEMA = pa.schema([("date", pa.string()), ("message", pa.string())])
UNIFIED_SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("message", pa.string()),
        ("time", pa.int64()),
        ("diff", pa.int64()),
    ]
)
REJECTS_SCHEMA = pa.schema(
    [
        ("date", pa.string()),
        ("message", pa.string()),
        ("raw", pa.string()),
        ("source_table", pa.string()),
        ("source_version", pa.int64()),
        ("reason", pa.string()),
        ("time", pa.int64()),
    ]
)

# Change data feed lets readers fetch exactly the rows each version added (and nothing
# for compaction commits), which is how the ETL and consumers tail a table.
# Write-serializable: another writer's delete, update or merge does not conflict with our
# blind appends (commitInfo.isBlindAppend), so it commits while the stream runs; under
# delta-rs' default, Serializable, every append in between fails it. delta-rs (through
# delta-kernel) reads only this camelCase spelling, and ignores "WriteSerializable";
# Delta Spark reads either (docs/adr/0001-write-serializable-tables.md).
ISOLATION_LEVEL = "writeSerializable"
TABLE_CONFIGURATION = {
    "delta.enableChangeDataFeed": "true",
    "delta.isolationLevel": ISOLATION_LEVEL,
}

META_PREFIX = "deltabus."


def table_configuration(lake: Lake) -> dict[str, str]:
    """Properties of tables deltabus creates: change data feed, write-serializable
    isolation, the log retention and the deleted-file retention."""
    config = dict(TABLE_CONFIGURATION)
    retention = lake.settings.log_retention_s
    if retention:
        # Log files older than this are deleted at the next checkpoint: a short retention
        # keeps commits fast on object stores whose listings grow with the log.
        config["delta.logRetentionDuration"] = f"interval {int(retention)} seconds"
    deleted = lake.settings.deleted_file_retention_s
    if deleted:
        # Removed files leave the log state after this, so compaction under a stream does
        # not grow checkpoints and writers' memory for a week (docs/adr/0035).
        config["delta.deletedFileRetentionDuration"] = f"interval {int(deleted)} seconds"
    return config


def ensure_table(
    lake: Lake, table: str, schema: pa.Schema, properties: dict[str, str] | None = None
) -> DeltaTable:
    """Open `table`, creating it empty with `schema` when it does not exist.

    Safe to call from several processes at once: a create that loses to another writer's
    create opens the table that writer made.

    Args:
        lake: the lake whose root holds the table.
        table: the table's name under the lake root (e.g. "timezone1").
        schema: the Arrow schema of a new table; an existing table keeps its own.
        properties: table properties of a new table, over deltabus' own.

    Returns:
        The table, loaded at its latest version. A new one carries deltabus' table
        properties (`table_configuration`: change data feed, writeSerializable isolation,
        the configured log and removed-file retention).

    Raises:
        StorageError: the lake cannot be reached or written (bucket, credentials,
            endpoint), after deltabus' storage retries.

    Example:
        `dt = ensure_table(Lake(load_settings()), "timezone1", INPUT_SCHEMA)`
    """
    if not lake.exists(table):
        try:
            DeltaTable.create(
                lake.uri(table),
                schema=schema,
                mode="ignore",
                configuration=table_configuration(lake) | (properties or {}),
                storage_options=lake.storage_options,
            )
        except (CommitFailedError, DeltaError) as exc:
            # Another writer created it first: fine, as long as it is there now.
            if not lake.exists(table):
                raise exc
    return lake.open(table)


def iter_commits(dt: DeltaTable, limit: int = 200) -> Iterator[dict[str, Any]]:
    """Newest-first commit infos, with our custom metadata at the top level."""
    yield from dt.history(limit=limit)


def find_commit(
    dt: DeltaTable, predicate: Callable[[dict[str, Any]], bool], limit: int = 200
) -> dict[str, Any] | None:
    """The newest commit (within `limit`) whose commit info satisfies `predicate`."""
    for info in iter_commits(dt, limit):
        if predicate(info):
            return info
    return None


def meta(info: dict[str, Any], key: str, default: Any = None) -> Any:
    """Read one of our metadata values from a commit info (JSON-decoded)."""
    raw = info.get(META_PREFIX + key)
    if raw is None:
        return default
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


def metadata(**values: Any) -> dict[str, str]:
    """Commit metadata under our prefix, JSON-encoded (delta-rs wants string values)."""
    return {META_PREFIX + k: json.dumps(v) for k, v in values.items()}


def is_commit_conflict(exc: BaseException) -> bool:
    """Another writer took the version we tried to commit: re-check and try again.

    delta-rs raises `CommitFailedError` for a lost version (its log store's conditional
    PUT or rename failed) and for a conflict with the commits in between.
    """
    return isinstance(exc, CommitFailedError)


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
    writer has been fenced (deltabus.etl.fence): only then does "(app_id, seq) is
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
