"""A Delta table's state kept in memory: its actions reconciled, commit after commit.

The state a checkpoint holds is defined by the Delta protocol ("Action Reconciliation",
"Checkpoints"): the latest protocol and metaData, the latest txn per appId, the latest
domainMetadata per domain (removed ones dropped), the live `add` per file and the
`remove` tombstones that have not expired. `TableState.apply` folds one commit's
actions (or a checkpoint's) into it; `seed` builds it from storage, from the newest V1
checkpoint at or before a version and the JSON commits after it.

Whatever this does not reproduce exactly raises `Unsupported`, and the caller leaves the
checkpoint to delta-rs: deletion vectors (files keyed by path and DV), partition columns
(`partitionValues_parsed`), v2 checkpoints, features such as row tracking whose
checkpoints hold more, stats written as structs, and app transaction expiry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import obstore
import pyarrow as pa
import pyarrow.parquet as pq

from deltabus.delta.snapshots import parse_actions

Actions = Mapping[str, list[dict[str, Any]]]

# Actions a checkpoint never holds (the Delta protocol, "Checkpoints").
IGNORED_ACTIONS = frozenset({"commitInfo", "cdc"})
RECONCILED_ACTIONS = frozenset({"protocol", "metaData", "txn", "domainMetadata", "add", "remove"})
# Features that do not change what a V1 checkpoint holds, given that no action carries a
# deletion vector (checked per action) and the table is not partitioned.
READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "typeWidening",
        "typeWidening-preview",
        "vacuumProtocolCheck",
    }
)
WRITER_FEATURES = READER_FEATURES | {
    "appendOnly",
    "invariants",
    "checkConstraints",
    "changeDataFeed",
    "generatedColumns",
    "identityColumns",
    "allowColumnDefaults",
    "domainMetadata",
    "checkpointProtection",
}
DEFAULT_LOG_RETENTION = "interval 30 days"  # delta-rs' and Delta's defaults
DEFAULT_DELETED_FILE_RETENTION = "interval 1 weeks"

_UNITS_MS = {
    "nanosecond": 1e-6,
    "microsecond": 1e-3,
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}
_V1_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet")


class Unsupported(Exception):
    """The table holds something this writer does not checkpoint: delta-rs does."""


def parse_interval_ms(value: str) -> int:
    """Milliseconds of a Delta interval ("interval 30 days"), parsed as delta-rs does."""
    parts = value.split()
    if len(parts) < 3 or not value.startswith("interval "):
        raise Unsupported(f"{value!r} is not an interval")
    try:
        number = int(parts[1])
    except ValueError:
        raise Unsupported(f"{value!r} is not an interval") from None
    unit = parts[2][:-1] if parts[2].endswith("s") else parts[2]
    if number < 0 or unit not in _UNITS_MS:
        raise Unsupported(f"{value!r} is not an interval")
    return int(number * _UNITS_MS[unit])


def config_value(metadata: dict[str, Any], key: str, default: str = "") -> str:
    """A table property (`default` when the table does not set it)."""
    value = (metadata.get("configuration") or {}).get(key)
    return default if value is None else str(value)


def unsupported(protocol: dict[str, Any], metadata: dict[str, Any]) -> str | None:
    """Why a V1 checkpoint from the reconciled actions alone would not be right, or None."""
    reader = set(protocol.get("readerFeatures") or ())
    writer = set(protocol.get("writerFeatures") or ())
    if int(protocol["minReaderVersion"]) > 3 or int(protocol["minWriterVersion"]) > 7:
        return f"protocol {protocol['minReaderVersion']}/{protocol['minWriterVersion']}"
    if reader - READER_FEATURES or writer - WRITER_FEATURES:
        return f"table features {sorted((reader - READER_FEATURES) | (writer - WRITER_FEATURES))}"
    if metadata.get("partitionColumns"):
        return "partition columns (partitionValues_parsed)"
    if (metadata.get("format") or {}).get("provider", "parquet") != "parquet":
        return "a data format other than parquet"
    if config_value(metadata, "delta.checkpoint.writeStatsAsStruct").lower() == "true":
        return "delta.checkpoint.writeStatsAsStruct"
    if config_value(metadata, "delta.checkpoint.writeStatsAsJson", "true").lower() == "false":
        return "delta.checkpoint.writeStatsAsJson=false"
    if "delta.setTransactionRetentionDuration" in (metadata.get("configuration") or {}):
        return "delta.setTransactionRetentionDuration (app transactions expire)"
    for key, default in (
        ("delta.logRetentionDuration", DEFAULT_LOG_RETENTION),
        ("delta.deletedFileRetentionDuration", DEFAULT_DELETED_FILE_RETENTION),
    ):
        try:
            parse_interval_ms(config_value(metadata, key, default))
        except Unsupported as exc:
            return f"{key}: {exc}"
    return None


# -- the reconciled state ------------------------------------------------------------------


def _require(action: dict[str, Any], kind: str, fields: dict[str, type]) -> None:
    """Raise Unsupported unless each field holds its type (a bool is not an int here)."""
    for name, wanted in fields.items():
        value = action.get(name)
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            raise Unsupported(f"a {kind} action without a valid {name}")


_ADD_FIELDS = {"path": str, "size": int, "modificationTime": int, "dataChange": bool}


@dataclass
class TableState:
    """A table's actions as of `version`, reconciled (Delta protocol: "Action Reconciliation")."""

    version: int = -1
    protocol: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    txns: dict[str, dict[str, Any]] = field(default_factory=dict)
    domains: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # live adds by path
    tombstones: dict[str, dict[str, Any]] = field(default_factory=dict)  # removes by path

    def apply(self, actions: Actions) -> None:
        """Apply one commit's actions (or a checkpoint's, which reconcile the same way)."""
        unknown = set(actions) - RECONCILED_ACTIONS - IGNORED_ACTIONS
        if unknown:
            raise Unsupported(f"{sorted(unknown)} actions")
        adds, removes = actions.get("add", ()), actions.get("remove", ())
        for action in (*adds, *removes):
            if action.get("deletionVector") is not None:
                raise Unsupported("deletion vectors")
        for add in adds:
            _require(add, "add", _ADD_FIELDS)
            if not isinstance(add.get("partitionValues"), dict):
                raise Unsupported("an add action without partitionValues")
        for remove in removes:
            _require(remove, "remove", {"path": str, "dataChange": bool})
        added = {unquote(a["path"]) for a in adds}
        removed = {unquote(r["path"]) for r in removes}
        if len(added) < len(adds) or len(removed) < len(removes) or added & removed:
            raise Unsupported("one commit with two actions on one file")
        for protocol in actions.get("protocol", ()):
            _require(protocol, "protocol", {"minReaderVersion": int, "minWriterVersion": int})
            self.protocol = protocol
        for metadata in actions.get("metaData", ()):
            _require(metadata, "metaData", {"id": str, "schemaString": str})
            self.metadata = metadata
        for txn in actions.get("txn", ()):
            _require(txn, "txn", {"appId": str, "version": int})
            self.txns[txn["appId"]] = txn
        for domain in actions.get("domainMetadata", ()):
            _require(domain, "domainMetadata", {"domain": str, "configuration": str})
            if domain.get("removed"):
                self.domains.pop(domain["domain"], None)
            else:
                self.domains[domain["domain"]] = domain
        for remove in removes:
            key = unquote(remove["path"])
            self.files.pop(key, None)
            self.tombstones[key] = remove
        for add in adds:
            key = unquote(add["path"])
            self.files[key] = add
            self.tombstones.pop(key, None)

    def expire_tombstones(self, now_ms: int) -> None:
        """Drop removes past `delta.deletedFileRetentionDuration` (none: expired, as delta-rs)."""
        assert self.metadata is not None
        keep = parse_interval_ms(
            config_value(
                self.metadata, "delta.deletedFileRetentionDuration", DEFAULT_DELETED_FILE_RETENTION
            )
        )
        cutoff = now_ms - keep
        self.tombstones = {
            k: r
            for k, r in self.tombstones.items()
            if int(r.get("deletionTimestamp") or 0) > cutoff
        }


# -- seeding from storage ------------------------------------------------------------------


def _get(store: Any, path: str) -> bytes | None:
    try:
        return bytes(obstore.get(store, path).bytes())
    except FileNotFoundError:
        return None


def _checkpoint_names(version: int, parts: int) -> list[str]:
    if parts == 1:
        return [f"{version:020d}.checkpoint.parquet"]
    return [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]


def _checkpoint_before(store: Any, log_dir: str, version: int) -> list[str]:
    """File names of the newest complete V1 checkpoint at or before `version` ([] if none):
    the one `_last_checkpoint` names, else the newest one a listing finds."""
    raw = _get(store, f"{log_dir}/_last_checkpoint")
    hint: dict[str, Any] = {}
    if raw is not None:
        try:
            hint = json.loads(raw)
        except ValueError:
            hint = {}  # read while being overwritten: list instead
    if 0 <= int(hint.get("version", -1)) <= version:
        if hint.get("v2Checkpoint"):
            raise Unsupported("a v2 checkpoint")
        return _checkpoint_names(int(hint["version"]), int(hint.get("parts") or 1))
    found: dict[tuple[int, int], set[int]] = {}
    for chunk in obstore.list(store, prefix=f"{log_dir}/", chunk_size=1000):
        for meta in chunk:
            match = _V1_CHECKPOINT.fullmatch(meta["path"].rsplit("/", 1)[-1])
            if match and int(match.group(1)) <= version:
                key = (int(match.group(1)), int(match.group(3) or 1))
                found.setdefault(key, set()).add(int(match.group(2) or 1))
    complete = [(v, n) for (v, n), got in found.items() if len(got) == n]
    return _checkpoint_names(*max(complete)) if complete else []


def _strip(action: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in action.items() if v is not None}


def checkpoint_actions(raw: bytes) -> dict[str, list[dict[str, Any]]]:
    """The actions of one V1 checkpoint file, as parse_actions gives a commit's."""
    table = pq.read_table(pa.BufferReader(raw))
    for v2 in ("sidecar", "checkpointMetadata"):
        if v2 in table.column_names and table.column(v2).null_count < table.num_rows:
            raise Unsupported("a v2 checkpoint")
    grouped: dict[str, list[dict[str, Any]]] = {}
    for kind in RECONCILED_ACTIONS:
        if kind not in table.column_names:
            continue
        column = table.column(kind)
        valid = column.filter(column.is_valid())
        grouped[kind] = [_strip(a) for a in valid.to_pylist(maps_as_pydicts="strict")]
    return grouped


def seed(store: Any, table: str, version: int) -> TableState:
    """The state of `table` at `version`, from its newest checkpoint and later commits."""
    log_dir = f"{table}/_delta_log"
    state = TableState()
    names = _checkpoint_before(store, log_dir, version)
    if names:
        parts: dict[str, list[dict[str, Any]]] = {}
        for name in names:
            raw = _get(store, f"{log_dir}/{name}")
            if raw is None:
                raise FileNotFoundError(f"{log_dir}/{name}")
            for kind, actions in checkpoint_actions(raw).items():
                parts.setdefault(kind, []).extend(actions)
        state.apply(parts)
        state.version = int(names[0][:20])
    for v in range(state.version + 1, version + 1):
        raw = _get(store, f"{log_dir}/{v:020d}.json")
        if raw is None:
            raise FileNotFoundError(f"{log_dir}/{v:020d}.json")
        state.apply(parse_actions(raw))
        state.version = v
    if state.protocol is None or state.metadata is None:
        raise Unsupported(f"no protocol or metadata at version {version}")
    return state
