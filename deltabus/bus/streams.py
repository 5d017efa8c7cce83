"""Streams: named, optionally partitioned sets of Delta tables with a declared schema.

A stream's declaration is recorded in the lake, at `_deltabus/streams/<name>/`, as a
record log (deltabus.bus.record_log), so that no reader has to be told its schema or
partition count. Partition i of stream `orders` is the table `orders-p{i}` (`orders` when
it has one partition), created with deltabus' table properties (change data feed,
write-serializable isolation), so other Delta writers' deletes and updates reach
consumers as retractions.

Declaring is idempotent. A declaration that differs from the recorded one is refused,
except additive schema evolution: the recorded columns unchanged and in order, followed
by new nullable ones, which are added to every partition table first and then recorded.
"""

from __future__ import annotations

import base64
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import pyarrow as pa

from deltabus.bus import record_log
from deltabus.bus.partitioning import PARTITIONERS, Partitioner
from deltabus.bus.partitions import MAX_PARTITIONS, partition_table
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.retention import RetentionPolicy
from deltabus.delta.tables import delta_columns, ensure_table, show_columns

STREAMS_PREFIX = "_deltabus/streams"
STREAM_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
# Columns a consumer adds to every batch: a stream may not declare them.
RESERVED_COLUMNS = frozenset({"diff", "_diff", "_partition", "_version"})


@dataclass(frozen=True)
class StreamSettings:
    """How a stream's tables are kept; None: the lake's setting.

    `log_retention_s`: log entries older than this are removed at checkpoints (the
    table property `delta.logRetentionDuration`); `checkpoint_interval`: a producer or
    transform checkpoints every this many versions; `compaction`: whether lake
    maintenance compacts the stream's small files.

    `retention_s` and `retention_bytes` (Kafka's `retention.ms` and `retention.bytes`;
    None: keep forever): lake maintenance drops each partition table's data files
    committed more than `retention_s` ago, and its oldest files until the table's live
    files hold at most `retention_bytes` (deltabus.delta.retention)."""

    log_retention_s: int | None = None
    checkpoint_interval: int | None = None
    compaction: bool = True
    retention_s: int | None = None
    retention_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("log_retention_s", "checkpoint_interval", "retention_s", "retention_bytes"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ConfigError(
                    f"stream setting {name} must be a positive integer, got {value!r}",
                    "give a whole number of at least 1, or None for the lake's setting"
                    if name in ("log_retention_s", "checkpoint_interval")
                    else "give a whole number of at least 1, or None to keep records forever",
                )
        if not isinstance(self.compaction, bool):
            raise ConfigError(
                f"stream setting compaction must be true or false, got {self.compaction!r}"
            )

    def retention(self) -> RetentionPolicy:
        """The retention lake maintenance applies to each partition table."""
        return RetentionPolicy(self.retention_s, self.retention_bytes)

    def properties(self) -> dict[str, str]:
        """The table properties these settings set."""
        if self.log_retention_s is None:
            return {}
        return {"delta.logRetentionDuration": f"interval {self.log_retention_s} seconds"}


@dataclass(frozen=True)
class Stream:
    """A declared stream: its name, schema, partition count, default key column and
    settings.

    `key`: the column whose value a producer hashes to pick a record's partition when
    `send` is given no key (None: records go to partitions in sticky spans).
    `partitioner`: how a key is hashed (deltabus.bus.partitioning): `crc32`, or `murmur2`
    for the partition numbers Kafka's default partitioner gives."""

    name: str
    schema: pa.Schema
    partitions: int = 1
    key: str | None = None
    revision: int = 0  # of the declaration in the lake (0: the first)
    settings: StreamSettings = StreamSettings()
    partitioner: Partitioner = "crc32"

    def __post_init__(self) -> None:
        if not STREAM_NAME.fullmatch(self.name):
            raise ConfigError(
                f"{self.name!r} is not a usable stream name",
                "use 1-63 lower-case letters, digits and '_', starting with a letter",
            )
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(
                f"stream {self.name}: partitions must be 1..{MAX_PARTITIONS}, got {self.partitions}"
            )
        if len(self.schema) == 0:
            raise ConfigError(f"stream {self.name}: the schema has no columns")
        names = self.schema.names
        clash = sorted(set(names) & RESERVED_COLUMNS)
        if clash or len(set(names)) != len(names):
            raise ConfigError(
                f"stream {self.name}: columns must have distinct names, none of "
                f"{', '.join(sorted(RESERVED_COLUMNS))} (got {', '.join(names)})"
            )
        if self.partitioner not in PARTITIONERS:
            raise ConfigError(
                f"stream {self.name}: partitioner {self.partitioner!r} is not one of "
                f"{', '.join(PARTITIONERS)}"
            )
        if self.key is not None and self.key not in names:
            raise ConfigError(
                f"stream {self.name}: key column {self.key!r} is not in the schema "
                f"({', '.join(names)})"
            )

    @property
    def tables(self) -> list[str]:
        """The partition tables, partition 0 first."""
        return [partition_table(self.name, i, self.partitions) for i in range(self.partitions)]

    def table(self, partition: int) -> str:
        return partition_table(self.name, partition, self.partitions)

    def record(self) -> dict:
        """The JSON body recorded in the lake."""
        return {
            "name": self.name,
            "partitions": self.partitions,
            "key": self.key,
            "columns": [
                {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema
            ],
            "schema_ipc": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "settings": asdict(self.settings),
            "partitioner": self.partitioner,
        }

    @classmethod
    def from_record(cls, body: dict, revision: int) -> Stream:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(body["schema_ipc"])))
        # Settings recorded before a setting existed read as its default.
        settings = StreamSettings(**body.get("settings", {}))
        partitions, key = int(body["partitions"]), body.get("key")
        partitioner = body.get("partitioner", "crc32")  # declared before there was a choice
        return cls(body["name"], schema, partitions, key, revision, settings, partitioner)


def _prefix(name: str) -> str:
    return f"{STREAMS_PREFIX}/{name}"


def get_stream(lake: Lake, name: str) -> Stream:
    """The stream `name` as declared in the lake.

    Raises:
        ConfigError: no stream of that name is declared (the message lists those that are).
    """
    found = record_log.latest(lake.object_store, _prefix(name))
    if found is None:
        known = list_streams(lake)
        raise ConfigError(
            f"no stream {name!r} in the lake at {lake.root}",
            "declare it first (deltabus streams create, or deltabus.create_stream); "
            + (f"streams here: {', '.join(known)}" if known else "this lake has no streams"),
        )
    return Stream.from_record(found.body, found.seq)


def list_streams(lake: Lake) -> list[str]:
    """The names of the streams declared in the lake, sorted."""
    import obstore

    def listed() -> list[str]:
        names: set[str] = set()
        for chunk in obstore.list(lake.object_store, prefix=f"{STREAMS_PREFIX}/"):
            for meta in chunk:
                parts = str(meta["path"]).split("/")
                if len(parts) >= 3 and STREAM_NAME.fullmatch(parts[-2]):
                    names.add(parts[-2])
        return sorted(names)

    return retry_storage(listed, what="list the lake's streams")


def create_stream(
    lake: Lake,
    name: str,
    schema: pa.Schema,
    *,
    partitions: int = 1,
    key: str | None = None,
    settings: StreamSettings | None = None,
    partitioner: Partitioner = "crc32",
) -> Stream:
    """Declare stream `name` and create its partition tables; idempotent.

    Args:
        lake: the lake the stream lives in.
        name: lower-case letters, digits and '_' (the tables are `name` or `name-p{i}`).
        schema: the Arrow schema of its records.
        partitions: how many tables (and Delta logs) carry it; fixed once declared.
        key: the column producers hash by default to choose a partition.
        partitioner: how keys are hashed: `crc32`, or Kafka's `murmur2` (fixed once
            declared).
        settings: log retention, checkpoint interval, compaction and the records'
            retention (None: as recorded, or the defaults for a new stream); other
            settings change the recorded ones (`alter_stream` changes some of them).

    Returns:
        The stream as recorded: the same declaration again returns it unchanged; a
        schema with new nullable columns at the end evolves it.

    Raises:
        ConfigError: another declaration of that name is recorded (partitions, key, or a
            schema change that is not additive); nothing is changed.

    Example:
        `create_stream(lake, "orders", pa.schema([("id", pa.int64())]), partitions=4)`
    """
    wanted = Stream(
        name,
        schema,
        partitions,
        key,
        settings=settings or StreamSettings(),
        partitioner=partitioner,
    )
    store = lake.object_store
    while True:
        current = record_log.latest(store, _prefix(name))
        if current is None:
            _create_tables(lake, wanted)
            if record_log.claim(store, _prefix(name), 0, wanted.record()):
                return wanted
            continue  # declared meanwhile: check against that declaration
        recorded = Stream.from_record(current.body, current.seq)
        added = _added_columns(recorded, wanted)
        kept = recorded.settings if settings is None else settings
        if not added and kept == recorded.settings:
            return recorded
        _add_columns(lake, recorded, added)
        if kept != recorded.settings:
            _set_properties(lake, recorded, kept)
        evolved = replace(wanted, revision=current.seq + 1, settings=kept)
        if record_log.claim(store, _prefix(name), current.seq + 1, evolved.record()):
            return evolved


def alter_stream(lake: Lake, name: str, **changes: Any) -> Stream:
    """Change the settings of declared stream `name`; its schema, partitions, key and
    partitioner stay as recorded.

    Args:
        lake: the lake the stream lives in.
        name: a declared stream.
        **changes: fields of `StreamSettings` and their new values (None: back to the
            default: the lake's setting, or no retention).

    Returns:
        The stream as recorded afterwards (unchanged, same revision, when nothing
        changes).

    Raises:
        ConfigError: no stream `name` is declared, a field is not a setting, or a value
            is invalid; nothing is changed.

    Example:
        `alter_stream(lake, "orders", retention_s=7 * 86400, retention_bytes=None)`
    """
    known = {f.name for f in fields(StreamSettings)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ConfigError(
            f"stream {name}: {', '.join(unknown)} is not a stream setting",
            f"change one of {', '.join(sorted(known))}",
        )
    while True:
        current = record_log.latest(lake.object_store, _prefix(name))
        if current is None:
            get_stream(lake, name)  # raises the ConfigError that lists the streams
        assert current is not None
        recorded = Stream.from_record(current.body, current.seq)
        settings = replace(recorded.settings, **changes)
        if settings == recorded.settings:
            return recorded
        if settings.properties() != recorded.settings.properties():
            _set_properties(lake, recorded, settings)
        altered = replace(recorded, revision=current.seq + 1, settings=settings)
        if record_log.claim(lake.object_store, _prefix(name), current.seq + 1, altered.record()):
            return altered


def _added_columns(recorded: Stream, wanted: Stream) -> list[pa.Field]:
    """The nullable columns `wanted` appends to `recorded`'s schema; raises ConfigError
    for any other difference."""
    name = recorded.name
    if wanted.partitions != recorded.partitions:
        raise ConfigError(
            f"stream {name} has {recorded.partitions} partitions, not {wanted.partitions}; "
            "partitions are not added or removed in place",
            f"declare it with {recorded.partitions}, or declare a stream of another name",
        )
    if wanted.partitioner != recorded.partitioner:
        raise ConfigError(
            f"stream {name} hashes keys with {recorded.partitioner}, not {wanted.partitioner}",
            f"declare it with partitioner {recorded.partitioner!r}, or declare a stream of "
            "another name",
        )
    if wanted.key != recorded.key:
        raise ConfigError(
            f"stream {name} is keyed by {recorded.key!r}, not {wanted.key!r}",
            f"declare it with key {recorded.key!r}, or declare a stream of another name",
        )
    have, want = recorded.schema, wanted.schema
    if len(want) < len(have) or any(
        not want.field(i).equals(have.field(i)) for i in range(len(have))
    ):
        raise ConfigError(
            f"stream {name} has the schema ({show_schema(have)}), which "
            f"({show_schema(want)}) does not extend",
            "keep the recorded columns as they are and in order; only new nullable columns "
            "may follow them",
        )
    added = [want.field(i) for i in range(len(have), len(want))]
    required = [f.name for f in added if not f.nullable]
    if required:
        raise ConfigError(
            f"stream {name}: new columns must be nullable (records written before have "
            f"none): {', '.join(required)}",
            "declare them nullable",
        )
    return added


def show_schema(schema: pa.Schema) -> str:
    """`name type[ not null], ...`: a schema on one line, for messages."""
    return ", ".join(f"{f.name} {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def written_types(dt: Any, schema: pa.Schema) -> pa.Schema:
    """`schema`'s columns with the types the Delta table `dt` stores them as (timestamps
    in microseconds): what rows are cast to before they are appended."""
    held = pa.schema(dt.schema().to_arrow())
    return pa.schema([held.field(name) for name in schema.names])


def _create_tables(lake: Lake, stream: Stream) -> None:
    """Create the partition tables that are missing; raises ConfigError, before any is
    created, when a table of the stream's name exists with other columns."""
    wanted = delta_columns(stream.schema)
    for table in stream.tables:
        if not retry_storage(lambda t=table: lake.exists(t), what=f"look for {table}"):
            continue
        found = delta_columns(
            retry_storage(lambda t=table: lake.open(t), what=f"open {table}").schema()
        )
        if found != wanted:
            raise ConfigError(
                f"stream {stream.name}: table {table} exists at {lake.uri(table)} with the "
                f"columns ({show_columns(found)}), not the declared ({show_columns(wanted)}); "
                "nothing was declared",
                "declare the stream with the table's columns, or choose another name",
            )
    for table in stream.tables:
        retry_storage(
            lambda t=table: ensure_table(lake, t, stream.schema, stream.settings.properties()),
            what=f"create {table}",
        )


def _set_properties(lake: Lake, stream: Stream, settings: StreamSettings) -> None:
    """Set the table properties `settings` asks for on every partition table (a
    retention going back to the lake's takes the lake's value)."""
    from deltabus.delta.tables import table_configuration

    wanted = settings.properties()
    if not wanted and stream.settings.properties():
        lakes = table_configuration(lake).get("delta.logRetentionDuration")
        wanted = {"delta.logRetentionDuration": lakes or "interval 30 days"}
    if not wanted:
        return
    for table in stream.tables:
        dt = ensure_table(lake, table, stream.schema)
        retry_storage(
            lambda dt=dt: dt.alter.set_table_properties(wanted, raise_if_not_exists=False),
            what=f"set the properties of {table}",
        )


def _add_columns(lake: Lake, stream: Stream, added: list[pa.Field]) -> None:
    """Add `added` to every partition table that lacks them (a crash between tables and
    record leaves some tables evolved: the next declaration finishes the rest)."""
    from deltalake import Schema as DeltaSchema

    for table in stream.tables:
        dt = ensure_table(lake, table, stream.schema)
        present = set(dt.schema().to_arrow().names)
        missing = [f for f in added if f.name not in present]
        if missing:
            fields = DeltaSchema.from_arrow(pa.schema(missing)).fields
            retry_storage(
                lambda dt=dt, fields=fields: dt.alter.add_columns(fields),
                what=f"add columns to {table}",
            )
