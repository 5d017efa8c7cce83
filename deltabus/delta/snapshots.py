"""The Delta log as a tail reads it: a commit's actions (`parse_actions`) and the table
state as of any version (`snapshot_at`), from the newest checkpoint before it and the
JSON commits after it, for a tail that resumes mid-log."""

from __future__ import annotations

import json
import re
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import obstore
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus.core import hedge
from deltabus.delta.table_schema import TableState

# commitInfo key under which a deltabus writer names the data file of its next commit, so
# that a tail can fetch that file together with the commit (deltabus.bus.tail).
NEXT_DATA_FILE = "deltabus.nextDataFile"


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

    def commit_later(self, version: int) -> Future[bytes | None]:
        """`commit(version)` sent now on a thread of its own: its answer when needed."""
        return hedge.submit_ahead(self.commit, version)

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
