"""A table's schema as a tail reads it: Delta types as Arrow types, column mapping
(`name` and `id` modes: physical names and Parquet field ids to logical names), and
partition values rebuilt from the log with the protocol's value serialisation."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from deltabus.core.errors import (
    InputTableError,
    UnsupportedFeatureError,
)
from deltabus.delta.reader_features import check_protocol, resume_hint

PRIMITIVE_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", "UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
}
DECIMAL_TYPE = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")


def arrow_type(delta_type: Any) -> pa.DataType:
    """The Arrow type of a Delta schema type (primitive name, or struct/array/map dict)."""
    if isinstance(delta_type, str):
        if delta_type in PRIMITIVE_TYPES:
            return PRIMITIVE_TYPES[delta_type]
        match = DECIMAL_TYPE.fullmatch(delta_type)
        if match:
            return pa.decimal128(int(match.group(1)), int(match.group(2)))
        raise ValueError(f"type {delta_type!r}")
    kind = delta_type.get("type")
    if kind == "struct":
        return pa.struct([pa.field(f["name"], arrow_type(f["type"])) for f in delta_type["fields"]])
    if kind == "array":
        return pa.list_(arrow_type(delta_type["elementType"]))
    if kind == "map":
        return pa.map_(arrow_type(delta_type["keyType"]), arrow_type(delta_type["valueType"]))
    raise ValueError(f"type {kind!r}")


@dataclass(frozen=True)
class Column:
    """One top-level column: logical name, where its values come from, and its type."""

    name: str
    physical: str  # physical name (the logical name without column mapping)
    field_id: int | None
    delta_type: Any
    type: pa.DataType
    partition: bool

    def reading(self, mode: str) -> tuple:
        """What decides the values a file yields for this column, for comparisons."""
        if self.partition:
            source: tuple = ("partition", self.physical)
        elif mode == "id":
            source = ("id", self.field_id)
        else:
            source = ("name", self.physical)
        return (source, str(self.type))


class TableState:
    """Protocol and metadata in force at one version, with the derived reading rules."""

    def __init__(self, protocol: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.protocol = protocol
        self.metadata = metadata
        self.reader_version = int(protocol.get("minReaderVersion", 1))
        self.writer_version = int(protocol.get("minWriterVersion", 2))
        self.reader_features = tuple(protocol.get("readerFeatures") or ())
        self.writer_features = tuple(protocol.get("writerFeatures") or ())
        config = metadata.get("configuration") or {}
        self.configuration: dict[str, str] = dict(config)
        self.cdf_enabled = str(config.get("delta.enableChangeDataFeed", "")).lower() == "true"
        mapping_supported = self.reader_version == 2 or "columnMapping" in self.reader_features
        mode = str(config.get("delta.columnMapping.mode", "none")).lower()
        self.mapping_mode = mode if mapping_supported else "none"
        self.partition_columns = list(metadata.get("partitionColumns") or [])
        self.format = (metadata.get("format") or {}).get("provider", "parquet")
        self._schema_error: str | None = None
        self.columns: list[Column] = []
        try:
            schema = json.loads(metadata.get("schemaString") or '{"fields": []}')
            for f in schema.get("fields", []):
                meta = f.get("metadata") or {}
                physical = f["name"]
                if self.mapping_mode != "none":
                    physical = meta.get("delta.columnMapping.physicalName", f["name"])
                fid = meta.get("delta.columnMapping.id")
                self.columns.append(
                    Column(
                        name=f["name"],
                        physical=physical,
                        field_id=int(fid) if fid is not None else None,
                        delta_type=f["type"],
                        type=arrow_type(f["type"]),
                        partition=f["name"] in self.partition_columns,
                    )
                )
        except (ValueError, KeyError, TypeError) as exc:
            self._schema_error = str(exc)
        self.plain = self.mapping_mode == "none" and not self.partition_columns

    def check(self, table: str, version: int) -> None:
        """Raise UnsupportedFeatureError unless a tail can read this version correctly."""
        check_protocol(table, version, self.protocol)
        where = f"{table} version {version}"
        if self.format != "parquet":
            raise UnsupportedFeatureError(
                f"{where} stores its data as {self.format!r}; deltabus reads Parquet tables",
                resume_hint(table),
            )
        if self.mapping_mode not in ("none", "name", "id"):
            raise UnsupportedFeatureError(
                f"{where} uses column mapping mode {self.mapping_mode!r}, which deltabus "
                "does not know (it reads none, name and id)",
                resume_hint(table),
            )
        if self._schema_error is not None:
            raise UnsupportedFeatureError(
                f"{where} has a schema deltabus cannot read: unsupported {self._schema_error}",
                "write the input with primitive, struct, array or map columns; "
                + resume_hint(table),
            )
        if self.mapping_mode == "id":
            missing = [c.name for c in self.columns if c.field_id is None and not c.partition]
            if missing:
                raise UnsupportedFeatureError(
                    f"{where} uses column mapping mode 'id' but columns {missing} have no "
                    "delta.columnMapping.id",
                    resume_hint(table),
                )
        for c in self.columns:
            if c.partition and not isinstance(c.delta_type, str):
                raise UnsupportedFeatureError(
                    f"{where} is partitioned by {c.name!r}, a non-primitive column",
                    resume_hint(table),
                )

    def reads_existing_rows_differently(self, newer: TableState) -> list[str]:
        """Columns whose values in files already written `newer` reads differently.

        A rename or drop (column mapping), a new mapping mode or a type change alters
        what earlier rows mean; adding a column does not (earlier rows read it as null).
        """
        new = {c.name: c.reading(newer.mapping_mode) for c in newer.columns}
        return [c.name for c in self.columns if new.get(c.name) != c.reading(self.mapping_mode)]


def parse_partition_value(raw: str | None, delta_type: str) -> Any:
    """A partition value from its serialised string (None or "" is null)."""
    if raw is None or raw == "":
        return None
    if delta_type == "string":
        return raw
    if delta_type in ("long", "integer", "short", "byte"):
        return int(raw)
    if delta_type in ("float", "double"):
        return float(raw)
    if delta_type == "boolean":
        lowered = raw.lower()
        if lowered not in ("true", "false"):
            raise ValueError(raw)
        return lowered == "true"
    if delta_type == "date":
        return date.fromisoformat(raw)
    if delta_type in ("timestamp", "timestamp_ntz"):
        value = datetime.fromisoformat(raw.replace(" ", "T", 1) if "T" not in raw else raw)
        if delta_type == "timestamp_ntz":
            return value.replace(tzinfo=None)
        # Without an offset the protocol means the writer's zone; deltabus assumes UTC.
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if delta_type == "binary":
        return raw.encode("utf-8")
    if DECIMAL_TYPE.fullmatch(delta_type):
        try:
            return Decimal(raw)
        except InvalidOperation:
            raise ValueError(raw) from None
    raise ValueError(f"type {delta_type}")


def partition_array(
    column: Column, partition_values: dict[str, Any], rows: int, where: str
) -> pa.Array:
    """The constant column of one file's partition value."""
    raw = partition_values.get(column.physical, partition_values.get(column.name))
    try:
        value = parse_partition_value(raw, column.delta_type)
    except (ValueError, TypeError) as exc:
        raise InputTableError(
            f"{where}: partition value {raw!r} of column {column.name!r} is not a valid "
            f"{column.delta_type} ({exc})",
            "fix the writer of this table",
        ) from None
    if value is None:
        return pa.nulls(rows, column.type)
    return pa.repeat(pa.scalar(value, column.type), rows)
