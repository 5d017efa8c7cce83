"""`deltabus streams`: declare, inspect, alter, maintain and delete streams of your own."""

from __future__ import annotations

import re
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from deltabus.cli.state import open_bus, print_value
from deltabus.core.errors import ConfigError

streams_app = typer.Typer(help="Declare and inspect streams of your own.", no_args_is_help=True)

SIMPLE_TYPES = {
    "bool": "bool_",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float32": "float32",
    "float64": "float64",
    "double": "float64",
    "string": "string",
    "binary": "binary",
    "date32": "date32",
}
TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:,\s*([^\]]+))?\]")
COLUMN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([a-z0-9_]+(?:\[[^\]]*\])?)\s*(!?)\s*")


def parse_schema(text: str) -> Any:
    """`name:type[!], ...` as an Arrow schema; `!` marks a required (non-null) column.
    Types: bool, int8-64, uint8-64, float32, float64, string, binary, date32,
    timestamp[unit] and timestamp[unit,zone]."""
    import pyarrow as pa

    fields = []
    for part in _split_columns(text):
        match = COLUMN.fullmatch(part)
        if match is None:
            raise ConfigError(
                f"--schema: {part.strip()!r} is not a column",
                "write columns as name:type, e.g. order_id:int64!,ts:timestamp[ms,UTC]",
            )
        name, kind, required = match.groups()
        stamp = TIMESTAMP.fullmatch(kind)
        if stamp is not None:
            arrow_type = pa.timestamp(stamp.group(1), stamp.group(2))
        elif kind in SIMPLE_TYPES:
            arrow_type = getattr(pa, SIMPLE_TYPES[kind])()
        else:
            raise ConfigError(
                f"--schema: unknown type {kind!r} of column {name}",
                f"use one of {', '.join(SIMPLE_TYPES)}, timestamp[unit] or timestamp[unit,zone]",
            )
        fields.append(pa.field(name, arrow_type, nullable=not required))
    if not fields:
        raise ConfigError(
            "--schema names no columns", "e.g. --schema order_id:int64!,amount:float64"
        )
    return pa.schema(fields)


def _split_columns(text: str) -> list[str]:
    """Split at commas outside brackets (timestamp[ms,UTC] is one type)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


RETENTION_S_OPTION = typer.Option(
    help="Drop records committed more than this many seconds ago, as whole data files, at "
    "lake maintenance (Kafka's retention.ms, in seconds; default: keep forever).",
    min=1,
)
RETENTION_BYTES_OPTION = typer.Option(
    help="Drop each partition table's oldest data files at lake maintenance until its "
    "live files hold at most this many bytes (Kafka's retention.bytes; default: no "
    "limit).",
    min=1,
)


class KeyHash(StrEnum):
    crc32 = "crc32"
    murmur2 = "murmur2"


@streams_app.command("create")
def streams_create(
    name: Annotated[str, typer.Argument(help="Stream name: lower-case letters, digits, '_'.")],
    schema: Annotated[
        str,
        typer.Option(
            help="Columns as name:type[!] separated by commas ('!': required), e.g. "
            "order_id:int64!,amount:float64,ts:timestamp[ms,UTC],customer:string."
        ),
    ],
    partitions: Annotated[int, typer.Option(help="Partition tables (1..64); fixed.")] = 1,
    key: Annotated[
        str | None, typer.Option(help="Column whose value picks a record's partition.")
    ] = None,
    partitioner: Annotated[
        KeyHash,
        typer.Option(
            help="How a key is hashed: crc32 (CRC-32 of its UTF-8 text), or murmur2 (Kafka's "
            "default partitioner: a key lands on the partition number it has in a Kafka "
            "topic with as many partitions); fixed."
        ),
    ] = KeyHash.crc32,
    log_retention_s: Annotated[
        int | None,
        typer.Option(help="Keep log entries this long (default: the lake's log retention)."),
    ] = None,
    checkpoint_interval: Annotated[
        int | None,
        typer.Option(help="Checkpoint every this many versions (default: the lake's)."),
    ] = None,
    compaction: Annotated[
        bool | None,
        typer.Option(
            "--compaction/--no-compaction",
            help="Whether lake maintenance compacts the stream's files (default: yes).",
        ),
    ] = None,
    retention_s: Annotated[int | None, RETENTION_S_OPTION] = None,
    retention_bytes: Annotated[int | None, RETENTION_BYTES_OPTION] = None,
) -> None:
    """Declare a stream (idempotent). Declaring it again with new nullable columns at
    the end adds them; settings given change the recorded ones; any other change is
    refused."""
    from deltabus.bus.streams import StreamSettings

    bus = open_bus()
    given = {
        "log_retention_s": log_retention_s,
        "checkpoint_interval": checkpoint_interval,
        "compaction": compaction,
        "retention_s": retention_s,
        "retention_bytes": retention_bytes,
    }
    settings = None
    if any(v is not None for v in given.values()):
        recorded = bus.stream(name).settings if name in bus.streams() else StreamSettings()
        settings = StreamSettings(
            **{k: (getattr(recorded, k) if v is None else v) for k, v in given.items()}
        )
    stream = bus.create_stream(
        name,
        parse_schema(schema),
        partitions=partitions,
        key=key,
        settings=settings,
        partitioner=partitioner.value,
    )
    print_value(_described(stream))


@streams_app.command("list")
def streams_list() -> None:
    """The streams declared in the lake."""
    for name in open_bus().streams():
        print(name)


@streams_app.command("describe")
def streams_describe(name: Annotated[str, typer.Argument(help="Stream name.")]) -> None:
    """A stream's declaration, and each partition table's latest version."""
    bus = open_bus()
    stream = bus.stream(name)
    described = _described(stream)
    described["versions"] = {t: bus.lake.open(t).version() for t in stream.tables}
    print_value(described)


@streams_app.command("alter")
def streams_alter(
    name: Annotated[str, typer.Argument(help="Stream name.")],
    retention_s: Annotated[int | None, RETENTION_S_OPTION] = None,
    retention_bytes: Annotated[int | None, RETENTION_BYTES_OPTION] = None,
    no_retention_s: Annotated[
        bool, typer.Option("--no-retention-s", help="Keep records whatever their age.")
    ] = False,
    no_retention_bytes: Annotated[
        bool, typer.Option("--no-retention-bytes", help="No size limit per partition.")
    ] = False,
    no_retention: Annotated[
        bool,
        typer.Option(
            "--no-retention", help="Keep records forever: --no-retention-s --no-retention-bytes."
        ),
    ] = False,
    log_retention_s: Annotated[
        int | None, typer.Option(help="Keep log entries this long.", min=1)
    ] = None,
    lake_log_retention: Annotated[
        bool,
        typer.Option(
            "--lake-log-retention",
            help="Log retention back to the lake's (DELTABUS_LOG_RETENTION_S, else Delta's "
            "30 days).",
        ),
    ] = False,
    checkpoint_interval: Annotated[
        int | None, typer.Option(help="Checkpoint every this many versions.", min=1)
    ] = None,
    lake_checkpoint_interval: Annotated[
        bool,
        typer.Option(
            "--lake-checkpoint-interval",
            help="Checkpoint interval back to the lake's (DELTABUS_CHECKPOINT_INTERVAL).",
        ),
    ] = False,
    compaction: Annotated[
        bool | None,
        typer.Option(
            "--compaction/--no-compaction",
            help="Whether lake maintenance compacts the stream's files.",
        ),
    ] = None,
) -> None:
    """Change a declared stream's settings (only those given); its schema, partitions
    and key stay. Prints the declaration as recorded afterwards."""
    changes: dict[str, Any] = {}
    for setting, value, cleared, reset_flag in (
        ("retention_s", retention_s, no_retention_s or no_retention, "--no-retention-s"),
        (
            "retention_bytes",
            retention_bytes,
            no_retention_bytes or no_retention,
            "--no-retention-bytes",
        ),
        ("log_retention_s", log_retention_s, lake_log_retention, "--lake-log-retention"),
        (
            "checkpoint_interval",
            checkpoint_interval,
            lake_checkpoint_interval,
            "--lake-checkpoint-interval",
        ),
    ):
        flag = setting.replace("_", "-")
        if value is not None and cleared:
            raise ConfigError(
                f"--{flag} {value} and {reset_flag} contradict each other", "give one of them"
            )
        if value is not None or cleared:
            changes[setting] = value
    if compaction is not None:
        changes["compaction"] = compaction
    if not changes:
        raise ConfigError(
            f"streams alter {name}: no setting to change",
            "give --retention-s, --retention-bytes, --no-retention-s, --no-retention-bytes, "
            "--no-retention, --log-retention-s, --lake-log-retention, --checkpoint-interval, "
            "--lake-checkpoint-interval or --compaction/--no-compaction",
        )
    print_value(_described(open_bus().alter_stream(name, **changes)))


@streams_app.command("maintain")
def streams_maintain(
    name: Annotated[
        str | None, typer.Argument(help="Stream name (default: every declared stream).")
    ] = None,
    vacuum_retention_hours: Annotated[
        float | None,
        typer.Option(
            help="Vacuum deletes removed files older than this; must exceed the slowest "
            "reader's lag (default: each table's deleted-file retention, "
            "DELTABUS_DELETED_FILE_RETENTION_S when it was created, else a week).",
            min=0,
        ),
    ] = None,
) -> None:
    """Maintain every declared stream, or NAME: per partition table, drop the records past
    its retention, compact (unless its compaction is off), checkpoint, clean up expired
    log files and vacuum. Prints what each did as JSON."""
    done = open_bus().maintain(name, vacuum_retention_hours=vacuum_retention_hours)
    print_value({"streams": [d.as_dict() for d in done]})


@streams_app.command("delete")
def streams_delete(
    name: Annotated[str, typer.Argument(help="Stream name.")],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete without asking for confirmation.")
    ] = False,
) -> None:
    """Delete a stream: its partition tables (every record), every consumer group's
    positions in them, and its declaration. Asks first unless --yes; cannot be undone."""
    from deltabus.bus.admin import stream_objects

    bus = open_bus()
    stream = bus.stream(name)
    found = stream_objects(bus.lake, stream)
    size = sum(b for _, b in found)
    what = (
        f"stream {name}: {len(stream.tables)} partition table(s) "
        f"({', '.join(stream.tables)}), the consumer groups' positions in them and the "
        f"declaration, {len(found)} objects, {size:,} bytes, under {bus.lake.root}"
    )
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"would delete {what}", "confirm with --yes")
        typer.confirm(f"Delete {what}?", abort=True, err=True)
    objects, removed = bus.delete_stream(name)
    print_value({"deleted": name, "objects": objects, "bytes": removed})


def _described(stream: Any) -> dict[str, Any]:
    record = stream.record()
    record.pop("schema_ipc")
    return {**record, "revision": stream.revision, "tables": stream.tables}
