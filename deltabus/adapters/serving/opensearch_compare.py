"""Does the served index equal the unified table's net content? Read both and compare
(the unified side as for PostgreSQL, deltabus.adapters.serving.compare)."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.compare import difference, unified_lag, unified_net
from deltabus.adapters.serving.opensearch_documents import POSITION_INDEX, check_index_name
from deltabus.delta.lake import Lake

INDEXED_SCHEMA = {
    "message": pl.String,
    "timestamp": pl.Float64,
    "time": pl.Int64,
    "version": pl.Int64,
}


def indexed(url: str, index: str) -> pl.DataFrame:
    """message, timestamp, time, version of every document of the index (a scroll over
    what is searchable: every batch the sink acknowledged)."""
    from opensearchpy import helpers

    client = osc.client(url)
    try:
        rows = [
            hit["_source"]
            for hit in helpers.scan(
                client,
                index=check_index_name(index),
                query={"query": {"match_all": {}}},
                size=5000,
                preserve_order=False,
            )
        ]
    finally:
        client.close()
    return pl.DataFrame(rows, schema=INDEXED_SCHEMA)


def indexed_position(url: str, sink: str) -> dict[str, Any] | None:
    """The sink's position document (version, source, commit ms), or None."""
    from opensearchpy.exceptions import NotFoundError

    client = osc.client(url)
    try:
        found = client.get(index=POSITION_INDEX, id=sink)
    except NotFoundError:
        return None
    finally:
        client.close()
    return found["_source"] if found.get("found") else None


def compare_index(lake: Lake, url: str, index: str) -> dict[str, Any]:
    """Counts and examples of what differs between the index and the net content
    (`served_rows` counts documents)."""
    return difference(unified_net(lake), indexed(url, index))


def index_lag(lake: Lake, url: str, sink: str) -> dict[str, Any]:
    """How far the index is behind timezone_unified, with the sink's position document."""
    doc = indexed_position(url, sink)
    lag = unified_lag(lake, -1 if doc is None else int(doc["version"]))
    return lag | {"position_doc": json.dumps(doc) if doc else None}
