"""The parts of the Delta protocol a tail needs to read tables other writers wrote.

deltabus tails its inputs by reading `_delta_log/<version>.json` directly (deltabus.bus.tail).
An input written by another engine may use protocol features that change how its files
must be read, so this module knows:

- which reader versions and reader features a tail can honour (`check_protocol`), and
  refuses the rest with an error naming the table, the version and the feature;
- the table's schema with column mapping (`name` and `id` modes: physical column names
  and Parquet field ids map to the logical names) and partition columns, whose values
  live in the log and are rebuilt with the protocol's value serialisation (`TableState`);
- deletion vectors: Z85, the RoaringBitmapArray format and DV files (`read_deletion_vector`);
- what a commit changed (`plan_changes`): its change data files when it has them, else
  its added and removed files (with the rows a deletion vector newly hides or shows),
  exactly as the protocol defines a version's change data;
- the table state as of any version, from the newest checkpoint before it and the JSON
  commits after it (`snapshot_at`), for a tail that resumes mid-log.

Everything is vectorised per file (pyarrow, NumPy); nothing loops over rows in Python.
"""

from __future__ import annotations

import io
import json
import logging
import re
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus.core import hedge
from deltabus.core.errors import ChangeWithoutCdfError as ChangeWithoutCdfError
from deltabus.core.errors import InputTableError as InputTableError
from deltabus.core.errors import RemovedFileError as RemovedFileError
from deltabus.core.errors import UnsupportedFeatureError as UnsupportedFeatureError

# commitInfo key under which a deltabus writer names the data file of its next commit, so
# that a tail can fetch that file together with the commit (deltabus.bus.tail).
NEXT_DATA_FILE = "deltabus.nextDataFile"

log = logging.getLogger(__name__)

MAX_READER_VERSION = 3
# Reader features a tail honours. Writer-only features need nothing from a reader.
SUPPORTED_READER_FEATURES = frozenset(
    {"columnMapping", "deletionVectors", "timestampNtz", "vacuumProtocolCheck"}
)
# Reader features known to the protocol that a tail refuses, and why.
REFUSED_READER_FEATURES = {
    "typeWidening": "files written before a column's type was widened hold the narrower "
    "type, which deltabus does not convert",
    "typeWidening-preview": "files written before a column's type was widened hold the "
    "narrower type, which deltabus does not convert",
    "v2Checkpoint": "deltabus reads classic checkpoints only (no UUID-named checkpoints "
    "or sidecar files)",
    "variantType": "variant columns are not part of the input contract",
    "variantType-preview": "variant columns are not part of the input contract",
    "variantShredding-preview": "variant columns are not part of the input contract",
    "catalogManaged": "its commits are ratified by a catalog, and deltabus reads "
    "_delta_log files only",
    "catalogOwned-preview": "its commits are ratified by a catalog, and deltabus reads "
    "_delta_log files only",
}
# Data files up to this size are read with one GET (size from the log's `add.size`).
WHOLE_FILE_BYTES = 64 * 1024 * 1024
CHANGE_TYPE_DIFF = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}

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


# -- errors ------------------------------------------------------------------------------


def _resume_hint(table: str) -> str:
    return (
        f"the ETL stopped before this version and wrote nothing of it; its position in "
        f"{table} is kept, so once the table is fixed the next start resumes right here"
    )


# -- schema -----------------------------------------------------------------------------


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
                _resume_hint(table),
            )
        if self.mapping_mode not in ("none", "name", "id"):
            raise UnsupportedFeatureError(
                f"{where} uses column mapping mode {self.mapping_mode!r}, which deltabus "
                "does not know (it reads none, name and id)",
                _resume_hint(table),
            )
        if self._schema_error is not None:
            raise UnsupportedFeatureError(
                f"{where} has a schema deltabus cannot read: unsupported {self._schema_error}",
                "write the input with primitive, struct, array or map columns; "
                + _resume_hint(table),
            )
        if self.mapping_mode == "id":
            missing = [c.name for c in self.columns if c.field_id is None and not c.partition]
            if missing:
                raise UnsupportedFeatureError(
                    f"{where} uses column mapping mode 'id' but columns {missing} have no "
                    "delta.columnMapping.id",
                    _resume_hint(table),
                )
        for c in self.columns:
            if c.partition and not isinstance(c.delta_type, str):
                raise UnsupportedFeatureError(
                    f"{where} is partitioned by {c.name!r}, a non-primitive column",
                    _resume_hint(table),
                )

    def reads_existing_rows_differently(self, newer: TableState) -> list[str]:
        """Columns whose values in files already written `newer` reads differently.

        A rename or drop (column mapping), a new mapping mode or a type change alters
        what earlier rows mean; adding a column does not (earlier rows read it as null).
        """
        new = {c.name: c.reading(newer.mapping_mode) for c in newer.columns}
        return [c.name for c in self.columns if new.get(c.name) != c.reading(self.mapping_mode)]


def check_protocol(table: str, version: int, protocol: dict[str, Any]) -> None:
    """Raise UnsupportedFeatureError unless a tail implements this protocol's reader side."""
    reader = int(protocol.get("minReaderVersion", 1))
    where = f"{table} version {version}"
    if reader > MAX_READER_VERSION:
        raise UnsupportedFeatureError(
            f"{where} requires Delta reader version {reader}; deltabus reads up to "
            f"{MAX_READER_VERSION}",
            "upgrade deltabus, or keep this input table on reader version "
            f"{MAX_READER_VERSION} or lower; " + _resume_hint(table),
        )
    if reader < 3:
        return
    features = list(protocol.get("readerFeatures") or [])
    unsupported = [f for f in features if f not in SUPPORTED_READER_FEATURES]
    if unsupported:
        feature = unsupported[0]
        why = REFUSED_READER_FEATURES.get(feature, "deltabus does not implement it")
        raise UnsupportedFeatureError(
            f"{where} requires Delta reader feature '{feature}'"
            + (f" (and {unsupported[1:]})" if len(unsupported) > 1 else "")
            + f": {why}",
            f"drop the feature from the table (Delta: ALTER TABLE ... DROP FEATURE {feature}) "
            "or write this input without it; deltabus reads reader features "
            f"{sorted(SUPPORTED_READER_FEATURES)}; " + _resume_hint(table),
        )


# -- partition values ------------------------------------------------------------------


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


# -- deletion vectors -------------------------------------------------------------------

Z85_ALPHABET = (
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)
_Z85_INDEX = {c: i for i, c in enumerate(Z85_ALPHABET)}
DV_MAGIC = 1681511377
_ROARING_COOKIE = 12347
_ROARING_COOKIE_NO_RUNS = 12346


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ Base85) to bytes; the text length is a multiple of 5."""
    if len(text) % 5:
        raise ValueError(f"Z85 text of length {len(text)}")
    out = bytearray()
    for start in range(0, len(text), 5):
        value = 0
        for ch in text[start : start + 5]:
            value = value * 85 + _Z85_INDEX[ch]
        out += value.to_bytes(4, "big")
    return bytes(out)


def _roaring32(data: bytes, pos: int) -> tuple[np.ndarray, int]:
    """One portable 32-bit Roaring bitmap at `pos`: (sorted values, position after it)."""
    (cookie,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if cookie & 0xFFFF == _ROARING_COOKIE:
        size = (cookie >> 16) + 1
        flag_bytes = (size + 7) // 8
        runs = np.unpackbits(np.frombuffer(data, np.uint8, flag_bytes, pos), bitorder="little")
        runs = runs[:size].astype(bool)
        pos += flag_bytes
        has_offsets = size >= 4
    elif cookie == _ROARING_COOKIE_NO_RUNS:
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        runs = np.zeros(size, bool)
        has_offsets = True
    else:
        raise ValueError(f"not a Roaring bitmap (cookie {cookie})")
    header = np.frombuffer(data, "<u2", 2 * size, pos).astype(np.uint32)
    pos += 4 * size
    keys, cards = header[0::2], header[1::2] + 1
    if has_offsets:
        pos += 4 * size
    parts = []
    for i in range(size):
        if runs[i]:
            (n_runs,) = struct.unpack_from("<H", data, pos)
            pos += 2
            pairs = np.frombuffer(data, "<u2", 2 * n_runs, pos).astype(np.int64)
            pos += 4 * n_runs
            starts, lengths = pairs[0::2], pairs[1::2] + 1
            firsts = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
            low = (np.arange(int(lengths.sum()), dtype=np.int64) + firsts).astype(np.uint32)
        elif cards[i] <= 4096:
            low = np.frombuffer(data, "<u2", int(cards[i]), pos).astype(np.uint32)
            pos += 2 * int(cards[i])
        else:
            bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, pos), bitorder="little")
            low = np.flatnonzero(bits).astype(np.uint32)
            pos += 8192
        parts.append(low | (keys[i] << np.uint32(16)))
    values = np.concatenate(parts) if parts else np.empty(0, np.uint32)
    return values, pos


def decode_roaring_array(data: bytes) -> np.ndarray:
    """Delta's RoaringBitmapArray: the sorted row indexes (uint64) a deletion vector hides.

    The protocol's format is a magic number then the portable 64-bit Roaring format
    (little endian). Delta Spark also reads, and once wrote, its "native" format: magic
    1681511376, a 32-bit bitmap count, then each 32-bit bitmap after its byte size, the
    bitmap's index being its upper 32 bits (the protocol's own inline example uses it,
    with big-endian header fields).
    """
    (magic,) = struct.unpack_from("<i", data, 0)
    parts = []
    if magic == DV_MAGIC:
        (buckets,) = struct.unpack_from("<q", data, 4)
        pos = 12
        for _ in range(buckets):
            (key,) = struct.unpack_from("<I", data, pos)
            values, pos = _roaring32(data, pos + 4)
            parts.append(values.astype(np.uint64) | (np.uint64(key) << np.uint64(32)))
    elif DV_MAGIC - 1 in (magic, struct.unpack_from(">i", data, 0)[0]):
        order = "<" if magic == DV_MAGIC - 1 else ">"
        (count,) = struct.unpack_from(order + "i", data, 4)
        pos = 8
        for key in range(count):
            (size,) = struct.unpack_from(order + "i", data, pos)
            values, _ = _roaring32(data, pos + 4)
            pos += 4 + size
            parts.append(values.astype(np.uint64) | (np.uint64(key) << np.uint64(32)))
    else:
        raise ValueError(f"deletion vector magic number {magic}, expected {DV_MAGIC}")
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def dv_relative_path(descriptor: dict[str, Any]) -> str:
    """File of a storageType 'u' deletion vector, relative to the table root."""
    text = descriptor["pathOrInlineDv"]
    prefix, encoded = text[:-20], text[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def dv_unique_id(descriptor: dict[str, Any] | None) -> str | None:
    if not descriptor:
        return None
    offset = descriptor.get("offset")
    base = f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
    return base if offset is None else f"{base}@{offset}"


# -- reading a table's files ------------------------------------------------------------


@dataclass
class FilePart:
    """Rows of one file that a commit changed, and their sign."""

    # "live": the rows `dv` does not hide; "cdc": change data; "dv": rows in `dv`, not in `minus`
    kind: str
    action: dict[str, Any]
    diff: int = 1
    dv: dict[str, Any] | None = None
    minus: dict[str, Any] | None = None


@dataclass
class ChangePlan:
    parts: list[FilePart] = field(default_factory=list)
    change: bool = False  # the commit deletes or updates rows (not only appends)
    unresolvable: str | None = None  # why its changes cannot be told from the log


def plan_changes(actions: dict[str, list[dict[str, Any]]], state: TableState | None) -> ChangePlan:
    """What a commit changed, as the protocol defines a version's change data.

    1. A commit with `cdc` actions: its change data files, and nothing else.
    2. Otherwise its data-changing `add` files are inserted rows and its data-changing
       `remove` files deleted rows, each as the logical file (rows its deletion vector
       hides are not in it). A file removed and re-added in the same commit with another
       deletion vector (a DELETE or UPDATE with deletion vectors) changed only the rows
       one vector hides and the other does not: those are deleted (newly hidden) or
       inserted again (no longer hidden, e.g. RESTORE).
    Rule 2 gives the rows a commit deleted only when it removes whole files that held
    nothing but deleted rows, which writers guarantee when the table's change data feed
    is on (otherwise they write `cdc` files). Without it, a removed file may have been
    rewritten with copies of its other rows: such a commit is `unresolvable`.
    """
    adds = [a for a in actions.get("add", ()) if a.get("dataChange", True)]
    removes = [r for r in actions.get("remove", ()) if r.get("dataChange", True)]
    cdcs = actions.get("cdc", [])
    plan = ChangePlan(change=bool(removes or cdcs))
    if cdcs:
        plan.parts = [FilePart("cdc", c) for c in cdcs]
        return plan
    added = {unquote(a["path"]): a for a in adds}
    removed = {unquote(r["path"]): r for r in removes}
    for path, add in added.items():
        old = removed.get(path)
        if old is None:
            plan.parts.append(FilePart("live", add, 1, dv=add.get("deletionVector")))
            continue
        new_dv, old_dv = add.get("deletionVector"), old.get("deletionVector")
        if dv_unique_id(new_dv) == dv_unique_id(old_dv):
            continue
        if new_dv:
            plan.parts.append(FilePart("dv", add, -1, dv=new_dv, minus=old_dv))
        if old_dv:
            plan.parts.append(FilePart("dv", add, 1, dv=old_dv, minus=new_dv))
    whole = [r for path, r in removed.items() if path not in added]
    if whole and not (state is not None and state.cdf_enabled):
        plan.unresolvable = (
            f"it removes {len(whole)} data file(s) while the table's change data feed is "
            "off, so the rows it deleted cannot be told from rows it copied into new files"
        )
    for remove in whole:
        plan.parts.append(FilePart("live", remove, -1, dv=remove.get("deletionVector")))
    return plan


class TableFiles:
    """Reads a table's data, change data and deletion vector files through the lake's
    obstore store: small files in one GET, large ones by ranged GETs."""

    def __init__(self, store: Any, table: str, root: str) -> None:
        """`store` is rooted at the lake root `root` (an `s3://bucket/prefix` URI or a
        local directory); `table` is the table's path in it."""
        self.store = store
        self.table = table
        self.root = root.rstrip("/")
        # Bytes of data files fetched ahead of their commit (`fetched_ahead`), by key.
        self._ahead: dict[str, bytes] = {}

    def fetched_ahead(self, name: str, data: bytes) -> None:
        """`data` is the content of the table's file `name` (relative to the table): the
        next read of that file takes it instead of a GET."""
        self._ahead = {self.resolve(name): data}

    def resolve(self, path: str) -> str:
        """The store key of a log path (relative to the table, or an absolute URI inside
        the lake root)."""
        if "://" not in path and not path.startswith("/"):
            return f"{self.table}/{unquote(path)}"
        parsed = urlparse(path)
        if parsed.scheme in ("s3", "s3a", "s3n"):
            absolute = f"s3://{parsed.netloc}{unquote(parsed.path)}"
        elif parsed.scheme in ("file", ""):
            absolute = unquote(parsed.path)
        else:
            absolute = path
        if absolute.startswith(self.root + "/"):
            return absolute[len(self.root) + 1 :]
        raise InputTableError(
            f"{self.table} refers to {path}, outside the storage deltabus reads",
            "keep input data files in the table's own storage",
        )

    def deletion_vector(self, descriptor: dict[str, Any], where: str) -> np.ndarray:
        """The row indexes a deletion vector hides (sorted, uint64)."""
        kind = descriptor.get("storageType")
        size = int(descriptor["sizeInBytes"])
        try:
            if kind == "i":
                data = z85_decode(descriptor["pathOrInlineDv"])[:size]
            elif kind in ("u", "p"):
                path = (
                    f"{self.table}/{dv_relative_path(descriptor)}"
                    if kind == "u"
                    else self.resolve(descriptor["pathOrInlineDv"])
                )
                data = self._dv_from_file(path, descriptor.get("offset"), size)
            else:
                raise ValueError(f"storage type {kind!r}")
            rows = decode_roaring_array(data)
        except (ValueError, KeyError, struct.error) as exc:
            raise InputTableError(
                f"{where}: cannot read deletion vector {descriptor}: {exc}",
                "check that the table's deletion vector files are intact",
            ) from None
        cardinality = descriptor.get("cardinality")
        if cardinality is not None and int(cardinality) != len(rows):
            raise InputTableError(
                f"{where}: deletion vector holds {len(rows)} rows, its descriptor says "
                f"{cardinality}",
                "check that the table's deletion vector files are intact",
            )
        return rows

    def _dv_from_file(self, key: str, offset: int | None, size: int) -> bytes:
        """The vector of `size` bytes at `offset` in the file `key`: one ranged GET."""
        # The protocol reads an absent offset as 0; writers put the first vector after
        # the file's version byte, so an absent offset is tried both ways.
        first = int(offset) if offset is not None else 0
        blob = bytes(obstore.get_range(self.store, key, start=first, length=size + 9))
        for start in (0,) if offset is not None else (0, 1):
            chunk = blob[start : start + size + 8]
            if len(chunk) == size + 8 and struct.unpack(">i", chunk[:4])[0] == size:
                data = chunk[4 : 4 + size]
                (checksum,) = struct.unpack(">I", chunk[4 + size :])
                if zlib.crc32(data) & 0xFFFFFFFF != checksum:
                    raise ValueError("checksum mismatch")
                return data
        raise ValueError(f"no vector of {size} bytes at offset {offset}")

    def _open(self, key: str, size: int | None) -> Any:
        """A random-access handle on a data file.

        A file the log says is small is fetched whole in one GET (random access would cost
        two ranged GETs, footer then columns); a larger one is read by ranged GETs.
        """
        ahead = self._ahead.pop(key, None)
        if ahead is not None and (size is None or len(ahead) == int(size)):
            return pa.BufferReader(pa.py_buffer(ahead))
        if size is not None and int(size) <= WHOLE_FILE_BYTES:
            return pa.BufferReader(pa.py_buffer(hedge.get(self.store, key)))
        return RangedFile(self.store, key, None if size is None else int(size))

    def read(
        self,
        state: TableState,
        action: dict[str, Any],
        where: str,
        *,
        columns: list[str] | None = None,
        change_type: bool = False,
    ) -> pa.Table:
        """The logical rows of one file: logical column names, partition columns rebuilt.

        Physical columns are found by physical name (column mapping `name`) or Parquet
        field id (`id`); columns a file lacks (added later) are null. Columns the schema
        does not have (e.g. `_change_type` in data files) are dropped, except
        `_change_type` when `change_type` (change data files).
        """
        wanted = (
            state.columns if columns is None else [c for c in state.columns if c.name in columns]
        )
        if "partitionValues" not in action and any(c.partition for c in wanted):
            raise InputTableError(
                f"{where}: {action['path']} is logged without its partition values, which "
                "partition columns need",
                "write the table with a writer that logs partition values in remove "
                "actions (extendedFileMetadata), as Delta Spark and delta-rs do",
            )
        try:
            handle = self._open(self.resolve(action["path"]), action.get("size"))
        except FileNotFoundError:
            raise RemovedFileError(
                f"{where}: {action['path']} is no longer in storage (vacuumed before this "
                "reader got to it)",
                "keep removed files longer than the longest reader outage (VACUUM "
                "retention), and reprocess this table's rows from an empty timezone_unified",
            ) from None
        with handle:
            parquet = pq.ParquetFile(handle)
            schema = parquet.schema_arrow
            if state.mapping_mode == "id":
                ids = {}
                for f in schema:
                    fid = (f.metadata or {}).get(b"PARQUET:field_id")
                    if fid is not None:
                        ids[int(fid)] = f.name
                if not ids and any(not c.partition for c in wanted):
                    raise InputTableError(
                        f"{where}: {action['path']} has no Parquet field ids, which column "
                        "mapping mode 'id' needs",
                        "rewrite the file with field ids (any Delta writer does)",
                    )
                source = {c.name: ids.get(c.field_id) for c in wanted if not c.partition}
            else:
                names = set(schema.names)
                key = "physical" if state.mapping_mode == "name" else "name"
                source = {
                    c.name: getattr(c, key) if getattr(c, key) in names else None
                    for c in wanted
                    if not c.partition
                }
            read = list(dict.fromkeys(s for s in source.values() if s is not None))
            if change_type and "_change_type" in schema.names:
                read.append("_change_type")
            data = parquet.read(columns=read)
        rows = data.num_rows
        arrays, names_out = [], []
        for c in wanted:
            if c.partition:
                arrays.append(partition_array(c, action.get("partitionValues") or {}, rows, where))
            elif source[c.name] is not None:
                arrays.append(data.column(source[c.name]))
            else:
                arrays.append(pa.nulls(rows, c.type))
            names_out.append(c.name)
        if change_type:
            if "_change_type" in data.column_names:
                arrays.append(data.column("_change_type"))
            else:
                value = (action.get("partitionValues") or {}).get("_change_type")
                if value is None:
                    raise InputTableError(
                        f"{where}: change data file {action['path']} has no _change_type",
                        "fix the writer of this table",
                    )
                arrays.append(pa.repeat(pa.scalar(value, pa.string()), rows))
            names_out.append("_change_type")
        return pa.Table.from_arrays(arrays, names=names_out)

    def part_rows(
        self, state: TableState, part: FilePart, where: str, columns: list[str] | None = None
    ) -> pa.Table:
        """The changed rows of one part, with an Int64 `_diff` (+1 insert, -1 retraction)."""
        if part.kind == "cdc":
            rows = self.read(state, part.action, where, columns=columns, change_type=True)
            kinds = rows.column("_change_type")
            diff = pc.fill_null(
                pc.if_else(
                    pc.is_in(kinds, pa.array(["insert", "update_postimage"])),
                    pa.scalar(1, pa.int64()),
                    pc.if_else(
                        pc.is_in(kinds, pa.array(["delete", "update_preimage"])),
                        pa.scalar(-1, pa.int64()),
                        pa.scalar(None, pa.int64()),
                    ),
                ),
                0,
            )
            unknown = pc.sum(pc.equal(diff, 0)).as_py() or 0
            if unknown:
                raise InputTableError(
                    f"{where}: change data file {part.action['path']} has {unknown} rows "
                    "with an unknown _change_type",
                    "fix the writer of this table",
                )
            rows = rows.drop_columns(["_change_type"])
            return rows.append_column("_diff", diff)
        rows = self.read(state, part.action, where, columns=columns)
        if part.dv:
            rows = without_views(rows)
        if part.kind == "live":
            if part.dv:
                hidden = self.deletion_vector(part.dv, where)
                keep = np.ones(rows.num_rows, bool)
                keep[hidden[hidden < rows.num_rows].astype(np.int64)] = False
                rows = rows.filter(pa.array(keep))
        else:  # "dv": rows in `dv` and not in `minus`
            chosen = self.deletion_vector(part.dv, where)  # type: ignore[arg-type]
            if part.minus:
                chosen = np.setdiff1d(chosen, self.deletion_vector(part.minus, where))
            rows = rows.take(pa.array(chosen.astype(np.int64)))
        diff = np.full(rows.num_rows, part.diff, np.int64)
        return rows.append_column("_diff", pa.array(diff))


def without_views(table: pa.Table) -> pa.Table:
    """`table` with string/binary view columns as plain string/binary (top level).

    Parquet files from delta-rs read back as views, which pyarrow's filter and take do
    not handle; only the change path (deletion vectors, retractions) needs them.
    """
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(f.type in plain for f in table.schema):
        return table
    return table.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema]))


def concat(parts: list[pa.Table]) -> pa.Table:
    """Tables of one commit or several, as one: columns missing in some are null, view
    and plain string types are unified (files from different writers differ)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0].schema
    if all(p.schema.equals(first) for p in parts[1:]):
        return pa.concat_tables(parts)
    return pa.concat_tables([without_views(p) for p in parts], promote_options="permissive")


# -- the log ------------------------------------------------------------------------------


def parse_actions(raw: bytes) -> dict[str, list[dict[str, Any]]]:
    """The actions of one JSON commit, grouped by kind (commitInfo, add, remove, cdc, ...)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for line in raw.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        for kind, body in action.items():
            grouped.setdefault(kind, []).append(body)
    return grouped


@dataclass
class Snapshot:
    version: int
    protocol: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    files: dict[str, dict[str, Any]] | None = None  # live add actions by path

    @property
    def state(self) -> TableState | None:
        if self.protocol is None or self.metadata is None:
            return None
        return TableState(self.protocol, self.metadata)

    def apply(self, actions: dict[str, list[dict[str, Any]]]) -> None:
        if actions.get("protocol"):
            self.protocol = actions["protocol"][-1]
        if actions.get("metaData"):
            self.metadata = actions["metaData"][-1]
        if self.files is not None:
            for remove in actions.get("remove", ()):
                self.files.pop(unquote(remove["path"]), None)
            for add in actions.get("add", ()):
                self.files[unquote(add["path"])] = add


class DeltaLog:
    """Reads one table's `_delta_log` (commits, `_last_checkpoint`, checkpoints) through
    the lake's obstore store: a read is one GET, a missing file one 404."""

    def __init__(self, store: Any, table: str) -> None:
        self.store = store
        self.dir = f"{table}/_delta_log"

    def read(self, name: str) -> bytes | None:
        try:
            return hedge.get(self.store, f"{self.dir}/{name}")
        except FileNotFoundError:
            return None

    def commit(self, version: int) -> bytes | None:
        return self.read(f"{version:020d}.json")

    def last_checkpoint(self) -> dict[str, Any] | None:
        raw = self.read("_last_checkpoint")
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None  # read mid-overwrite: callers list the log instead

    def checkpoints(self) -> dict[int, list[str]]:
        """Every checkpoint in the log: version -> its file names (listing the log)."""
        found: dict[int, list[str]] = {}
        pattern = re.compile(r"(\d{20})\.checkpoint(\.\d{10}\.\d{10})?\.parquet")
        names = [
            str(meta["path"]).rsplit("/", 1)[-1]
            for chunk in obstore.list(self.store, prefix=f"{self.dir}/", chunk_size=1000)
            for meta in chunk
        ]
        for name in names:
            match = pattern.fullmatch(name)
            if match:
                found.setdefault(int(match.group(1)), []).append(name)
            elif re.fullmatch(r"\d{20}\.checkpoint\.[^.]+\.(json|parquet)", name):
                found.setdefault(int(name[:20]), []).append(name)
        return found

    def checkpoint_files(self, version: int, hint: dict[str, Any] | None) -> list[str]:
        """File names of the checkpoint at `version`, from `_last_checkpoint` or a listing."""
        if hint is not None and int(hint.get("version", -1)) == version:
            if hint.get("v2Checkpoint"):
                return [hint["v2Checkpoint"]["path"]]
            parts = hint.get("parts")
            if parts:
                n = int(parts)
                return [
                    f"{version:020d}.checkpoint.{i:010d}.{n:010d}.parquet" for i in range(1, n + 1)
                ]
            return [f"{version:020d}.checkpoint.parquet"]
        return sorted(self.checkpoints().get(version, []))

    def checkpoint_actions(self, names: list[str], files: bool) -> dict[str, list[dict[str, Any]]]:
        """protocol, metaData (and add when `files`) actions of a checkpoint."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        wanted = ["protocol", "metaData"] + (["add", "sidecar"] if files else [])
        for name in names:
            if name.endswith(".json"):
                raw = self.read(name)
                if raw is None:
                    raise FileNotFoundError(name)
                for kind, bodies in parse_actions(raw).items():
                    if kind in wanted:
                        grouped.setdefault(kind, []).extend(bodies)
                continue
            with self._parquet(f"{self.dir}/{name}") as handle:
                parquet = pq.ParquetFile(handle)
                present = [c for c in wanted if c in parquet.schema_arrow.names]
                table = parquet.read(columns=present)
            for kind in present:
                column = table.column(kind)
                valid = column.filter(pc.is_valid(column))
                grouped.setdefault(kind, []).extend(_plain(v) for v in valid.to_pylist())
        for sidecar in grouped.pop("sidecar", []):
            with self._parquet(f"{self.dir}/_sidecars/{sidecar['path']}") as handle:
                column = pq.ParquetFile(handle).read(columns=["add"]).column("add")
            valid = column.filter(pc.is_valid(column))
            grouped.setdefault("add", []).extend(_plain(v) for v in valid.to_pylist())
        return grouped

    def _parquet(self, key: str) -> Any:
        """A checkpoint part or sidecar, fetched whole (one GET)."""
        raw = self.read(key[len(self.dir) + 1 :])
        if raw is None:
            raise FileNotFoundError(key)
        return pa.BufferReader(pa.py_buffer(raw))


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over one object: every read is one ranged GET.

    What pyarrow's Parquet reader takes for a large data file: it reads the footer, then
    the column chunks it needs.
    """

    def __init__(self, store: Any, key: str, size: int | None = None) -> None:
        super().__init__()
        self.store, self.key = store, key
        self.size = int(obstore.head(store, key)["size"]) if size is None else size
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        length = min(len(buffer), self.size - self.position)
        if length <= 0:
            return 0
        data = obstore.get_range(self.store, self.key, start=self.position, length=length)
        view = memoryview(data)
        buffer[: len(view)] = view
        self.position += len(view)
        return len(view)


def _plain(value: Any) -> Any:
    """A checkpoint row as the JSON action would be: Parquet maps as dicts."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):
            return {k: _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    return value


def snapshot_at(delta_log: DeltaLog, version: int, *, files: bool = False) -> Snapshot | None:
    """Protocol and metadata (and live files) as of `version`; None when the log no
    longer holds what is needed (expired commits)."""
    hint = delta_log.last_checkpoint()
    start: int | None = None
    if hint is not None and 0 <= int(hint.get("version", -1)) <= version:
        start = int(hint["version"])
    else:
        older = [v for v in delta_log.checkpoints() if v <= version]
        start = max(older) if older else None
        hint = None
    snapshot = Snapshot(version=version, files={} if files else None)
    if start is not None:
        try:
            snapshot.apply(
                delta_log.checkpoint_actions(delta_log.checkpoint_files(start, hint), files)
            )
        except FileNotFoundError:
            return None
    for v in range((start if start is not None else -1) + 1, version + 1):
        raw = delta_log.commit(v)
        if raw is None:
            return None
        snapshot.apply(parse_actions(raw))
    return snapshot
