"""The OpenSearch sink's bulk lines (deltabus.adapters.serving.opensearch_documents):
one external-version `index` operation per inserted row, ids as `document_id` makes
them, and no line for a timestamp JSON cannot carry."""

from __future__ import annotations

import json

import polars as pl
import pytest

from deltabus.adapters.serving.opensearch_documents import (
    HASHED_ID_PREFIX,
    MAX_ID_BYTES,
    document_id,
    index_operations,
)


def test_each_row_is_one_index_operation_with_its_external_version() -> None:
    messages = ["m1", 'quote " and\\nnewline\n', "é" * 300, HASHED_ID_PREFIX + "x", ""]
    rows = pl.DataFrame(
        {
            "message": messages,
            "timestamp": [1.5, 1732000000.123456, 1e-7, -2.0, 0.0],
            "time": [1, 2, 3, 4, 5],
            "version": [7, 7, 8, 9, 9],
            "diff": [1] * 5,
        }
    )
    operations = index_operations(rows)
    assert len(operations) == 5
    for (meta, doc), row in zip(operations, rows.iter_rows(named=True), strict=True):
        assert json.loads(meta) == {
            "index": {
                "_id": document_id(row["message"]),
                "version": row["version"],
                "version_type": "external",
            }
        }
        assert json.loads(doc) == {k: row[k] for k in ("message", "timestamp", "time", "version")}
    ids = [json.loads(meta)["index"]["_id"] for meta, _ in operations]
    assert ids[0] == "m1" and ids[1] == messages[1]  # plain ids stay the message
    # Too long for an id (600 bytes), the hashed prefix itself, or empty: hashed.
    assert len(messages[2].encode()) > MAX_ID_BYTES
    assert all(i.startswith(HASHED_ID_PREFIX) and len(i) == 71 for i in ids[2:])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_timestamp_json_cannot_carry_is_an_error(bad: float) -> None:
    rows = pl.DataFrame(
        {"message": ["ok", "bad"], "timestamp": [1.0, bad], "time": [1, 2], "version": [1, 1]}
    )
    with pytest.raises(ValueError, match="'bad': timestamp"):
        index_operations(rows)
