"""Creating Delta tables with deltabus' properties, and reading their commit metadata."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.schema import PrimitiveType

from deltabus.core.retry import retry_storage
from deltabus.delta.checkpoint_state import seed
from deltabus.delta.lake import Lake

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


def delta_columns(schema: pa.Schema | Schema) -> list[tuple[str, str]]:
    """(name, Delta type) per column, e.g. ("message", "string"): how a table stores an
    Arrow schema (timestamps of any unit are one Delta type), nullability aside."""
    delta = Schema.from_arrow(schema) if isinstance(schema, pa.Schema) else schema
    return [
        (f.name, f.type.type if isinstance(f.type, PrimitiveType) else str(f.type))
        for f in delta.fields
    ]


def show_columns(columns: list[tuple[str, str]]) -> str:
    """`name type, ...`: `delta_columns` on one line, for messages."""
    return ", ".join(f"{name} {kind}" for name, kind in columns)


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


def app_transactions(lake: Lake, table: str) -> dict[str, int]:
    """Every app transaction of `table`'s newest version: appId -> version.

    Read from the newest checkpoint and the commits after it, so log cleanup never hides
    one (delta-rs answers only for an appId already known)."""

    def read() -> dict[str, int]:
        latest = lake.latest_version(table)
        state = seed(lake.object_store, table, latest)
        return {app: int(txn["version"]) for app, txn in state.txns.items()}

    return retry_storage(read, what=f"read {table}'s app transactions")
