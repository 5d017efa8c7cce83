"""Checkpoints are written by a background thread, not inside a writer's commit."""

from __future__ import annotations

import json
import logging
import time

import pyarrow as pa
import pytest

from deltabus.apps.timezones.contracts import INPUT_SCHEMA
from deltabus.delta.append import append_once
from deltabus.delta.checkpoints import BackgroundCheckpointer
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table


def log_objects(lake: Lake, table: str) -> list[str]:
    client = lake.s3_client()
    prefix = f"{lake.settings.prefix}/{table}/_delta_log/"
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=lake.settings.bucket, Prefix=prefix
    )
    return sorted(o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", []))


def batch(i: int) -> pa.Table:
    return pa.table(
        {
            "date": ["2026-01-01 00:00:00.000000 +0100"] * 3,
            "message": [f"m{i}-{j}" for j in range(3)],
        },
        schema=INPUT_SCHEMA,
    )


def test_checkpoints_land_beside_the_commits(minio_lake: Lake) -> None:
    dt = ensure_table(minio_lake, "timezone1", INPUT_SCHEMA)
    checkpointer = BackgroundCheckpointer(minio_lake, "timezone1", interval=5)
    assert checkpointer.interval == 5
    handles = []  # kept alive, so ids stay distinct
    for seq in range(12):
        dt = checkpointer.refreshed(dt)  # as writers do: a fresh handle after a checkpoint
        handles.append(dt)
        append_once(
            dt,
            batch(seq),
            app_id="writer",
            seq=seq,
            custom_metadata={},
            what="test commit",
            checkpointer=checkpointer,
        )
        if seq == 6:
            time.sleep(1)  # let the first checkpoint finish so its handle gets swapped in
    checkpointer.close()
    assert dt.version() == 12
    assert len({id(h) for h in handles}) >= 2  # swapped to a handle loaded after a checkpoint
    assert checkpointer.failures == 0
    # At most one checkpoint per interval crossed (with the table's offset), and the
    # last interval reached is always covered.
    buckets = [(v + checkpointer.offset) // 5 for v in checkpointer.written]
    assert len(buckets) == len(set(buckets)) >= 2
    assert buckets[-1] == (12 + checkpointer.offset) // 5

    names = log_objects(minio_lake, "timezone1")
    checkpoints = sorted(int(n.split(".")[0]) for n in names if n.endswith(".checkpoint.parquet"))
    assert checkpoints == sorted(checkpointer.written)
    last = json.loads(
        minio_lake.s3_client()
        .get_object(
            Bucket=minio_lake.settings.bucket,
            Key=f"{minio_lake.settings.prefix}/timezone1/_delta_log/_last_checkpoint",
        )["Body"]
        .read()
    )
    assert last["version"] == checkpointer.written[-1]

    # A reader that starts from the checkpoint sees the full state and the markers.
    fresh = minio_lake.open("timezone1")
    assert fresh.version() == 12
    assert fresh.to_pyarrow_table().num_rows == 36
    assert fresh.transaction_version("writer") == 11


def test_a_failed_checkpoint_is_logged_not_raised(
    minio_lake: Lake, caplog: pytest.LogCaptureFixture
) -> None:
    checkpointer = BackgroundCheckpointer(minio_lake, "no_such_table", interval=1)
    with caplog.at_level(logging.WARNING, logger="deltabus.delta.checkpoints"):
        checkpointer.committed(3)
        checkpointer.close()
    assert checkpointer.failures == 1
    assert checkpointer.written == []
    assert "checkpoint of no_such_table at version 3 failed" in caplog.text
    assert minio_lake.settings.secret_key.get_secret_value() not in caplog.text
