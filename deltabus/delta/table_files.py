"""Reading a table's data, change data and deletion vector files through obstore: small
files in one GET, large ones by ranged GETs (`RangedFile`), vectorised per file."""

from __future__ import annotations

import io
import struct
import zlib
from concurrent.futures import Future
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus.core import hedge
from deltabus.core.errors import (
    InputTableError,
    RemovedFileError,
)
from deltabus.delta.change_plan import FilePart
from deltabus.delta.deletion_vectors import decode_roaring_array, dv_relative_path, z85_decode
from deltabus.delta.table_schema import TableState, partition_array

# Files fetched ahead and not read yet, at most: the oldest is dropped past it.
MAX_AHEAD_FILES = 64
# Data files up to this size are read with one GET (size from the log's `add.size`).
WHOLE_FILE_BYTES = 64 * 1024 * 1024


class TableFiles:
    """Reads a table's data, change data and deletion vector files through the lake's
    obstore store: small files in one GET, large ones by ranged GETs."""

    def __init__(self, store: Any, table: str, root: str) -> None:
        """`store` is rooted at the lake root `root` (an `s3://bucket/prefix` URI or a
        local directory); `table` is the table's path in it."""
        self.store = store
        self.table = table
        self.root = root.rstrip("/")
        # Data files fetched ahead of their read, by key: their bytes (`fetched_ahead`)
        # or a GET on its way (`fetch_later`). A read takes its entry out.
        self._ahead: dict[str, bytes | Future[bytes]] = {}

    def fetched_ahead(self, name: str, data: bytes) -> None:
        """`data` is the content of the table's file `name` (relative to the table): the
        next read of that file takes it instead of a GET."""
        self._keep_ahead(self.resolve(name), data)

    def fetch_later(self, name: str) -> None:
        """Send the GET of the table's file `name` now; its next read takes the answer."""
        key = self.resolve(name)
        if key not in self._ahead:
            self._keep_ahead(key, hedge.get_later(self.store, key))

    def _keep_ahead(self, key: str, entry: bytes | Future[bytes]) -> None:
        while len(self._ahead) >= MAX_AHEAD_FILES:
            del self._ahead[next(iter(self._ahead))]
        self._ahead[key] = entry

    def forget_ahead(self) -> None:
        """Drop what was fetched ahead (a tail repositioned: those reads may not come)."""
        self._ahead.clear()

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
        if isinstance(ahead, Future):
            try:
                ahead = ahead.result()
            except Exception:  # noqa: BLE001 - read as usual below, raising what it raises
                ahead = None
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
