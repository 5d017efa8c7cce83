"""Compaction that commits beside a live stream.

Small data files are rewritten into files of about `target_bytes`, and the rewrite is
committed as `TableAppender` commits: one conditional PUT claims the next version, and
when a writer took it first, the claim is tried again on top of the commits that landed.
A rewrite conflicts only with a commit that removed one of its input files (a delete, an
update or another compaction) or changed the protocol or the metadata; it then gives up,
deletes the files it wrote, and the next pass tries again. Appends never conflict. Why
not delta-rs' optimize: docs/adr/0036-compaction-beside-a-stream.md.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote
from urllib.parse import unquote as _unquote

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError

from deltabus.core.errors import CompactionConflict as CompactionConflict
from deltabus.core.retry import retry_storage
from deltabus.core.version import __version__
from deltabus.delta.append import data_file_name, eligible, file_stats, protocol_and_metadata
from deltabus.delta.lake import Lake
from deltabus.delta.parquet_io import parquet_buffer
from deltabus.delta.snapshots import parse_actions
from deltabus.delta.table_files import without_views

log = logging.getLogger(__name__)

TARGET_FILE_BYTES = 64 * 1024 * 1024  # Parquet bytes read into one output file
MAX_COMMIT_ATTEMPTS = 1000
READ_CONCURRENCY = 16
TOKEN_KEY = "deltabus.compaction"


@dataclass
class CompactionPlan:
    """The files one rewrite replaces, as of `read_version`, in bins of one output each."""

    table: str
    read_version: int
    bins: list[list[dict[str, Any]]] = field(default_factory=list)

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return [add for group in self.bins for add in group]


@dataclass(frozen=True)
class Compacted:
    """What a committed rewrite did."""

    version: int
    files_removed: int
    files_added: int
    rows: int


def plan_compaction(
    lake: Lake,
    table: str,
    target_bytes: int = TARGET_FILE_BYTES,
    dt: DeltaTable | None = None,
    segment_ms: int | None = None,
) -> CompactionPlan | None:
    """Bins of the table's files smaller than `target_bytes`, oldest first, each bin at
    most `target_bytes` of Parquet, read from `dt` when given (else the table is loaded);
    a bin of one file is not a rewrite. With `segment_ms`, a bin holds only files written
    within one segment (`modificationTime // segment_ms`), as Kafka rolls a log segment by
    time: a slow stream's files then still age out under a retention by time, instead of
    being merged again and again into one file as new as its newest record. None when this
    module does not rewrite the table (a feature a plain writer does not honour, deletion
    vectors, or file names that need escaping); the caller then uses delta-rs."""
    if dt is None:
        dt = retry_storage(lambda: lake.open(table), what=f"load {table}")
    protocol, metadata = protocol_and_metadata(dt)
    reason = eligible(protocol, metadata)
    if reason is None and "deletionVectors" in (protocol.get("writerFeatures") or ()):
        reason = "deletion vectors"
    files = pa.table(dt.get_add_actions(flatten=True))
    paths = files.column("path").to_pylist()
    if reason is None and any(quote(path) != path for path in paths):
        reason = "file names that need escaping"
    if reason:
        log.info("%s is compacted by delta-rs: %s", table, reason)
        return None
    columns = ("size_bytes", "modification_time")
    sizes, written = (files.column(name).to_pylist() for name in columns)
    small = [
        {"path": path, "size": size, "partitionValues": {}, "modificationTime": at}
        for at, path, size in sorted(zip(written, paths, sizes, strict=True))
        if size < target_bytes
    ]
    plan = CompactionPlan(table, dt.version())
    current: list[dict[str, Any]] = []
    size = 0
    segment = None
    for add in small:
        at = add["modificationTime"]
        here = None if segment_ms is None or at is None else int(at) // segment_ms
        if current and (size + add["size"] > target_bytes or here != segment):
            plan.bins.append(current)
            current, size = [], 0
        segment = here
        current.append(add)
        size += add["size"]
    if current:
        plan.bins.append(current)
    plan.bins = [group for group in plan.bins if len(group) > 1]
    return plan


def compact(
    lake: Lake,
    table: str,
    target_bytes: int = TARGET_FILE_BYTES,
    dt: DeltaTable | None = None,
    segment_ms: int | None = None,
) -> Compacted | None:
    """Rewrite the table's small files (in bins of one time segment each with
    `segment_ms`, see `plan_compaction`) and commit the rewrite beside live writers.

    Returns None when the table needs delta-rs (see `plan_compaction`), and a `Compacted`
    with 0 files when there was nothing to rewrite. Raises CompactionConflict when another
    commit removed an input file or changed the schema first; nothing is then committed
    and the files written are deleted.
    """
    plan = plan_compaction(lake, table, target_bytes, dt, segment_ms)
    if plan is None:
        return None
    if not plan.bins:
        return Compacted(plan.read_version, 0, 0, 0)
    adds = rewrite_files(lake, plan)
    try:
        version = commit_rewrite(lake, plan, adds)
    except BaseException:
        for add in adds:
            _delete_quietly(lake, f"{table}/{add['path']}")
        raise
    rows = sum(int(json.loads(add["stats"])["numRecords"]) for add in adds)
    return Compacted(version, len(plan.inputs), len(adds), rows)


def rewrite_files(lake: Lake, plan: CompactionPlan) -> list[dict[str, Any]]:
    """Write one file per bin of `plan` under a fresh name; their add actions, not yet
    committed (`commit_rewrite` commits them)."""
    return [_rewrite(lake, plan.table, group) for group in plan.bins]


def _rewrite(lake: Lake, table: str, group: list[dict[str, Any]]) -> dict[str, Any]:
    """One output file holding every row of `group`, written under a fresh name."""

    def read(add: dict[str, Any]) -> pa.Table:
        key = f"{table}/{_unquote(add['path'])}"
        raw = retry_storage(
            lambda: bytes(obstore.get(lake.object_store, key).bytes()), what=f"read {key}"
        )
        return without_views(pq.read_table(pa.BufferReader(raw)))

    with ThreadPoolExecutor(READ_CONCURRENCY) as pool:  # small files: latency-bound GETs
        parts = list(pool.map(read, group))
    data = pa.concat_tables(parts, promote_options="default")
    body = parquet_buffer(data)
    name = data_file_name()
    retry_storage(
        lambda: obstore.put(lake.object_store, f"{table}/{name}", body.to_pybytes()),
        what=f"write a compacted file of {table}",
    )
    # The newest of its inputs' times: a file's age is that of its newest record, so
    # compaction does not restart the clock of a stream's retention (deltabus.delta.retention).
    written = [int(add["modificationTime"]) for add in group if "modificationTime" in add]
    return {
        "path": name,
        "partitionValues": {},
        "size": body.size,
        "modificationTime": max(written) if written else int(time.time() * 1000),
        "dataChange": False,
        "stats": file_stats(data),
    }


def commit_rewrite(lake: Lake, plan: CompactionPlan, adds: list[dict[str, Any]]) -> int:
    """Commit `adds` in place of the plan's inputs at the next free version; returns it.

    Raises CompactionConflict when a commit after `plan.read_version` removed an input
    or changed the protocol or metadata.
    """
    token = uuid.uuid4().hex  # finds our own commit if an answer was lost and retried
    return commit_beside(
        lake,
        plan.table,
        plan.read_version,
        _commit_body(plan, adds, token),
        token=token,
        token_key=TOKEN_KEY,
        relied_on={_unquote(add["path"]) for add in plan.inputs},
        conflict=CompactionConflict,
        what="compaction",
    )


def commit_beside(
    lake: Lake,
    table: str,
    read_version: int,
    body: bytes,
    *,
    token: str,
    token_key: str,
    relied_on: set[str],
    conflict: type[Exception],
    what: str,
) -> int:
    """Commit `body` at the first free version after `read_version`, beside live writers;
    returns that version.

    The next version is claimed with one conditional PUT; when it is taken, the commits
    that landed are read (GET until a 404) and the claim is tried again on top of them. A
    commit whose commit info carries `token` under `token_key` is this one, landed
    already (an answer lost and retried). Raises `conflict` when a commit that landed
    first removed a file of `relied_on` or changed the protocol or metadata.
    """
    version = read_version
    for _ in range(MAX_COMMIT_ATTEMPTS):
        key = f"{table}/_delta_log/{version + 1:020d}.json"
        try:
            retry_storage(
                lambda key=key: obstore.put(lake.object_store, key, body, mode="create"),
                what=f"commit the {what} of {table}",
            )
            return version + 1
        except (AlreadyExistsError, PreconditionError):
            pass
        version, ours = _follow(lake, table, version, relied_on, token, token_key, conflict)
        if ours:
            return version
    raise conflict(f"{table}: no free log version after {MAX_COMMIT_ATTEMPTS} attempts")


def _follow(
    lake: Lake,
    table: str,
    version: int,
    relied_on: set[str],
    token: str,
    token_key: str,
    conflict: type[Exception],
) -> tuple[int, bool]:
    """Read the commits after `version` (GET until a 404): the newest version, and True
    when that is the caller's own commit. Raises `conflict` when one of them touches
    what the caller relies on."""
    while True:
        key = f"{table}/_delta_log/{version + 1:020d}.json"
        try:
            raw = retry_storage(
                lambda key=key: bytes(obstore.get(lake.object_store, key).bytes()),
                what=f"read {key}",
            )
        except FileNotFoundError:
            return version, False
        actions = parse_actions(raw)
        infos = actions.get("commitInfo", ())
        if any(info.get(token_key) == token for info in infos):
            return version + 1, True
        if actions.get("protocol") or actions.get("metaData"):
            raise conflict(f"{table} version {version + 1} changed the schema")
        removed = {_unquote(r["path"]) for r in actions.get("remove", ())} & relied_on
        if removed:
            raise conflict(
                f"{table} version {version + 1} removed {len(removed)} file(s) this commit "
                "relies on"
            )
        version += 1


def _commit_body(plan: CompactionPlan, adds: list[dict[str, Any]], token: str) -> bytes:
    now = int(time.time() * 1000)
    info = {
        TOKEN_KEY: token,
        "timestamp": now,
        "operation": "OPTIMIZE",
        "operationParameters": {"targetSize": str(TARGET_FILE_BYTES)},
        "readVersion": plan.read_version,
        "isBlindAppend": False,
        "engineInfo": f"deltabus/{__version__}",
        "clientVersion": f"deltabus-{__version__}",
        "operationMetrics": {
            "numRemovedFiles": str(len(plan.inputs)),
            "numAddedFiles": str(len(adds)),
        },
    }
    removes = [
        {
            "path": add["path"],
            "deletionTimestamp": now,
            "dataChange": False,
            "extendedFileMetadata": True,
            "partitionValues": add.get("partitionValues") or {},
            "size": int(add["size"]),
        }
        for add in plan.inputs
    ]
    lines = [
        {"commitInfo": info},
        *({"remove": remove} for remove in removes),
        *({"add": add} for add in adds),
    ]
    return "\n".join(json.dumps(line, separators=(",", ":")) for line in lines).encode()


def _delete_quietly(lake: Lake, key: str) -> None:
    try:
        obstore.delete(lake.object_store, key)
    except (BaseError, OSError) as exc:  # an orphan file is what vacuum removes
        log.warning("could not delete %s after a failed compaction: %s", key, exc)
