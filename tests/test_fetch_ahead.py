"""A tail on a remote store fetches a deltabus writer's next data file together with the
next commit (the writer names it in the commit before), and reads the same rows as
without; on loopback it sends no request ahead."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import INPUT_SCHEMA
from deltabus.bus.tail import DeltaLogTail
from deltabus.delta.append import TableAppender
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table
from deltabus_bench.store_profiles import PROFILES, StoreProxy
from tests.conftest import minio_settings_for

COMMITS = 40


def _batch(i: int) -> pa.Table:
    return pa.table(
        {
            "date": [f"2026-11-26 12:00:{i % 60:02d}.000000 -0500"] * 3,
            "message": [f"m{i}-{k}" for k in range(3)],
        },
        schema=INPUT_SCHEMA,
    )


def _append_and_tail(lake: Lake) -> tuple[DeltaLogTail, list[str]]:
    dt = ensure_table(lake, "events", INPUT_SCHEMA)
    appender = TableAppender(lake, "events", dt)
    tail = DeltaLogTail(lake, "events")
    tail.start(1)
    seen: list[str] = []
    for i in range(COMMITS):
        appender.append_once(_batch(i), app_id="w", seq=i, custom_metadata={}, what="append")
        commit = tail.commit(i + 1)
        assert commit is not None
        assert tail.commit(i + 2) is None  # a poll for the next one: not there yet
        rows = tail.rows(commit)
        assert rows is not None
        seen += rows.column("message").to_pylist()
    return tail, seen


def test_next_data_file_comes_with_the_commit_on_a_remote_store(
    minio: MinioServer, toxiproxy: Path, tmp_path: Path
) -> None:
    expected = [f"m{i}-{k}" for i in range(COMMITS) for k in range(3)]
    with StoreProxy(
        PROFILES["s3-standard"], minio.endpoint, tmp_path, seed=2, binary=toxiproxy
    ) as proxy:
        settings = minio_settings_for(minio, f"ahead-{uuid.uuid4().hex[:8]}")
        remote = Lake(settings.model_copy(update={"minio_endpoint": proxy.endpoint}))
        tail, seen = _append_and_tail(remote)
    assert seen == expected
    # Once the store's median GET is known to be remote (after 20 GETs), every commit's
    # file comes with its commit.
    assert tail.fetched_ahead >= COMMITS - 15, tail.fetched_ahead

    local_tail, local_seen = _append_and_tail(
        Lake(minio_settings_for(minio, f"ahead-{uuid.uuid4().hex[:8]}"))
    )
    assert local_seen == expected
    assert local_tail.fetched_ahead == 0
