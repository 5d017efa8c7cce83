"""A tail on a remote store fetches a deltabus writer's next data file together with the
next commit (the writer names it in the commit before), and a tail that is behind reads
the next log entries and their files side by side (`read_ahead`); both read the same rows
as without. On loopback neither sends a request ahead."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import INPUT_SCHEMA
from deltabus.bus.tail import READ_AHEAD_MAX, DeltaLogTail
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


EXPECTED = [f"m{i}-{k}" for i in range(COMMITS) for k in range(3)]


def _remote_and_local(
    minio: MinioServer,
    toxiproxy: Path,
    tmp_path: Path,
    seed: int,
    run: Callable[[Lake], tuple[DeltaLogTail, list[str]]],
) -> tuple[DeltaLogTail, DeltaLogTail]:
    """`run` on a fresh lake behind the s3-standard profile, then on loopback; both must
    read EXPECTED. Their tails."""
    with StoreProxy(
        PROFILES["s3-standard"], minio.endpoint, tmp_path, seed=seed, binary=toxiproxy
    ) as proxy:
        settings = minio_settings_for(minio, f"ahead-{uuid.uuid4().hex[:8]}")
        remote, seen = run(Lake(settings.model_copy(update={"minio_endpoint": proxy.endpoint})))
    assert seen == EXPECTED  # in order, each once
    local, local_seen = run(Lake(minio_settings_for(minio, f"ahead-{uuid.uuid4().hex[:8]}")))
    assert local_seen == EXPECTED
    return remote, local


def test_next_data_file_comes_with_the_commit_on_a_remote_store(
    minio: MinioServer, toxiproxy: Path, tmp_path: Path
) -> None:
    tail, local_tail = _remote_and_local(minio, toxiproxy, tmp_path, 2, _append_and_tail)
    # Once the store's median GET is known to be remote (after 20 GETs), every commit's
    # file comes with its commit.
    assert tail.fetched_ahead >= COMMITS - 15, tail.fetched_ahead
    assert local_tail.fetched_ahead == 0


def _read_backlog(lake: Lake) -> tuple[DeltaLogTail, list[str]]:
    """Append COMMITS commits, then tail them as the Pathway connector does when behind:
    a read-ahead window sent before each read."""
    dt = ensure_table(lake, "backlog", INPUT_SCHEMA)
    appender = TableAppender(lake, "backlog", dt)
    for i in range(COMMITS):
        appender.append_once(_batch(i), app_id="w", seq=i, custom_metadata={}, what="append")
    tail = DeltaLogTail(lake, "backlog")
    tail.start(1)
    seen: list[str] = []
    for version in range(1, COMMITS + 1):
        tail.read_ahead(version + 1, READ_AHEAD_MAX)
        commit = tail.commit(version)
        assert commit is not None
        rows = tail.rows(commit)
        assert rows is not None
        seen += rows.column("message").to_pylist()
    assert tail.commit(COMMITS + 1) is None
    tail.read_ahead(COMMITS + 1, READ_AHEAD_MAX)  # ahead of the end: nothing there yet
    appender.append_once(_batch(99), app_id="w", seq=COMMITS, custom_metadata={}, what="a")
    late = tail.commit(COMMITS + 1)  # found missing ahead, landed since: read again
    assert late is not None and tail.rows(late).num_rows == 3
    return tail, seen


def test_a_tail_behind_reads_the_backlog_side_by_side_on_a_remote_store(
    minio: MinioServer, toxiproxy: Path, tmp_path: Path
) -> None:
    tail, local_tail = _remote_and_local(minio, toxiproxy, tmp_path, 3, _read_backlog)
    # Once the store is known to be remote (20 GETs), the entries come from reads ahead.
    assert tail.read_ahead_hits >= COMMITS - 20, tail.read_ahead_hits
    assert local_tail.read_ahead_hits == 0
