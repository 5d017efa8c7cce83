"""What a served OpenSearch index holds: its name rules, mapping, document ids, and the
`_bulk` operations and request bodies a batch of changes becomes
(docs/adr/0005-opensearch-sink.md)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

import polars as pl

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.core.errors import ConfigError

POSITION_INDEX = "deltabus_sink_position"
DEFAULT_INDEX = "indexed_unified"
INDEX_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,99}")
MAX_ID_BYTES = 512
HASHED_ID_PREFIX = "sha256:"
BULK_OPERATIONS = 5000  # per request: a batch larger than this is sent in several
BULK_BYTES = 8 * 1024 * 1024

INDEXED_FIELDS = {"message": "keyword", "timestamp": "double", "time": "long", "version": "long"}
INDEX_MAPPING = {
    "dynamic": "strict",
    "properties": {
        # keyword for exact lookups and sorting (Lucene keeps terms up to 32766 bytes:
        # longer messages stay in _source only), text for full-text search.
        "message": {"type": "keyword", "ignore_above": 8191, "fields": {"text": {"type": "text"}}},
        "timestamp": {"type": "double"},
        "time": {"type": "long"},
        "version": {"type": "long"},
    },
}
POSITION_MAPPING = {
    "dynamic": "strict",
    "properties": {
        "sink": {"type": "keyword"},
        "source_table": {"type": "keyword"},
        "version": {"type": "long"},
        "snapshot_version": {"type": "long"},
        "source_commit_ms": {"type": "long"},
        "updated_at": {"type": "date", "format": "epoch_millis"},
    },
}
ONE_SHARD = {"number_of_shards": 1, "auto_expand_replicas": "0-1"}


def check_index_name(name: str) -> str:
    """A served index name: lower-case letters, digits, '_' and '-' (not the position index)."""
    if not INDEX_NAME.fullmatch(name) or name == POSITION_INDEX:
        raise ConfigError(
            f"--index {name!r} is not a usable index name",
            "use 1-100 lower-case letters, digits, '_' and '-', starting with a letter or digit",
        )
    return name


def document_id(message: str) -> str:
    """The `_id` of a message's document: the message, or `sha256:<hex>` of it when
    OpenSearch cannot take it as an id or it starts with that prefix."""
    raw = message.encode("utf-8")
    if 0 < len(raw) <= MAX_ID_BYTES and not message.startswith(HASHED_ID_PREFIX):
        return message
    return HASHED_ID_PREFIX + hashlib.sha256(raw).hexdigest()


def bulk_bodies(lines: list[tuple[str, str | None]]) -> Iterator[str]:
    """Bulk request bodies (NDJSON) of at most BULK_OPERATIONS operations and about
    BULK_BYTES each."""
    body: list[str] = []
    size = count = 0
    for meta, doc in lines:
        body.append(meta)
        size += len(meta) + 1
        if doc is not None:
            body.append(doc)
            size += len(doc) + 1
        count += 1
        if count >= BULK_OPERATIONS or size >= BULK_BYTES:
            yield "\n".join(body) + "\n"
            body, size, count = [], 0, 0
    if body:
        yield "\n".join(body) + "\n"


def raise_unread(docs: list[dict[str, Any]]) -> None:
    """Raise ItemReadsFailed when a multi-get answered some documents with an error
    instead of their state. Such an item has no `found`: taking it for "gone" would skip
    its delete for good (a node recovering its shards after a restart answers so)."""
    errors = [doc["error"] for doc in docs if doc.get("error") is not None]
    if errors:
        types = [str(e.get("type")) if isinstance(e, dict) else str(e) for e in errors]
        first = errors[0]
        reason = first.get("reason") if isinstance(first, dict) else first
        raise osc.ItemReadsFailed(types, f"{types[0]}: {reason}")


def split_changes(changes: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The insertions of `final_changes`, and the retractions of messages not inserted
    again."""
    inserts = changes.filter(pl.col("diff") > 0)
    retracted = changes.filter(pl.col("diff") < 0).join(
        inserts.select("message"), on="message", how="anti"
    )
    return inserts, retracted


def index_operations(inserts: pl.DataFrame) -> list[tuple[str, str | None]]:
    """One external-version `index` operation per inserted row, its lines encoded by
    Polars (a tenth of the CPU of `json.dumps` per row, the same bytes). A timestamp that
    is not a finite number raises ValueError, as `to_json` does."""
    rows = inserts.select("message", "timestamp", "time", "version")
    bad = rows.filter(~pl.col("timestamp").is_finite())
    if bad.height:
        message, timestamp = bad.row(0)[:2]
        raise ValueError(f"message {message!r}: timestamp {timestamp} is not a JSON number")
    plain = pl.col("message").str.len_bytes().is_between(1, MAX_ID_BYTES) & ~pl.col(
        "message"
    ).str.starts_with(HASHED_ID_PREFIX)
    ids = (
        pl.when(plain)
        .then(pl.col("message"))
        .otherwise(pl.col("message").map_elements(document_id, return_dtype=pl.String))
    )
    meta = pl.struct(ids.alias("_id"), "version", pl.lit("external").alias("version_type"))
    lines = rows.select(
        pl.struct(meta.alias("index")).struct.json_encode().alias("meta"),
        pl.struct("message", "timestamp", "time", "version").struct.json_encode().alias("doc"),
    )
    return list(zip(lines["meta"].to_list(), lines["doc"].to_list(), strict=True))


def to_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
