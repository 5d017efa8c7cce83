"""Compaction beside a live stream, on real MinIO: the rewrite commits while a writer
claims a new version every few milliseconds, loses no row and repeats none, and gives
way to a delete of a file it is rewriting."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA
from deltabus.delta.append import TableAppender
from deltabus.delta.compaction import (
    CompactionConflict,
    commit_rewrite,
    compact,
    plan_compaction,
    rewrite_files,
)
from deltabus.delta.lake import Lake
from deltabus.delta.maintenance import maintain_table
from deltabus.delta.tables import ensure_table
from tests.helpers import unified_rows


def _messages(lake: Lake, table: str) -> list[str]:
    fresh = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
    return sorted(fresh.to_pyarrow_table(columns=["message"]).column("message").to_pylist())


def _fill(lake: Lake, table: str, commits: int, per_commit: int = 10) -> TableAppender:
    ensure_table(lake, table, UNIFIED_SCHEMA)
    appender = TableAppender(lake, table, lake.open(table))
    for seq in range(commits):
        rows = unified_rows(seq * per_commit, per_commit)
        assert appender.append_once(rows, app_id="w", seq=seq, custom_metadata={}, what="append")
    return appender


def test_compaction_commits_while_a_writer_commits_every_few_ms(minio_lake: Lake) -> None:
    table = "busy"
    appender = _fill(minio_lake, table, commits=120)
    stop = threading.Event()
    written = [120]

    def stream() -> None:
        seq = 120
        while not stop.is_set():
            appender.append_once(
                unified_rows(seq * 10, 10), app_id="w", seq=seq, custom_metadata={}, what="append"
            )
            seq += 1
            written[0] = seq

    writer = threading.Thread(target=stream)
    writer.start()
    try:
        done = compact(minio_lake, table)
    finally:
        stop.set()
        writer.join(60)
    assert done is not None and done.files_removed >= 120 and done.files_added == 1
    assert written[0] > 125  # the writer kept committing while the rewrite was committed
    assert _messages(minio_lake, table) == sorted(f"m{i}" for i in range(written[0] * 10))
    dt = minio_lake.open(table)
    assert len(dt.file_uris()) <= 1 + (written[0] - 120)  # the compacted file + newer ones
    assert dt.transaction_version("w") == written[0] - 1


def test_compaction_gives_way_to_a_delete_of_a_file_it_rewrites(minio_lake: Lake) -> None:
    table = "deleted"
    _fill(minio_lake, table, commits=5)
    plan = plan_compaction(minio_lake, table)
    assert plan is not None and len(plan.inputs) == 5
    adds = rewrite_files(minio_lake, plan)
    minio_lake.open(table).delete("message = 'm3'")  # another writer rewrites that file
    with pytest.raises(CompactionConflict, match="removed 1 file"):
        commit_rewrite(minio_lake, plan, adds)
    expected = sorted(f"m{i}" for i in range(50) if i != 3)
    assert _messages(minio_lake, table) == expected  # m3 stays deleted, nothing doubled

    # The next pass plans from the new state and commits.
    result = maintain_table(minio_lake, table, retention_hours=1)
    assert result.files_compacted >= 5 and result.files_added == 1
    assert _messages(minio_lake, table) == expected


def test_vacuum_removes_compacted_files_after_their_tombstones_expired(
    local_lake: Lake,
) -> None:
    """Compacted-away files outlive their tombstones when the deleted-file retention is no
    longer than the vacuum's (a soak sets them equal): once the files are old enough, the
    newest checkpoint no longer names them. Maintenance vacuums every file no version
    within the retention references, so they go. (The retention is 1 s for the
    tombstones here, and the second vacuum's is 0 h, standing in for the hour passed,
    full as it is from an hour's retention on.)"""
    import time

    lake, table = local_lake, "timezone_unified"
    expiring = {"delta.deletedFileRetentionDuration": "interval 1 seconds"}
    ensure_table(lake, table, UNIFIED_SCHEMA, expiring)
    _fill(lake, table, commits=5)
    root = Path(lake.root) / table
    first = maintain_table(lake, table, retention_hours=1)
    assert first.files_compacted == 5 and first.files_vacuumed == 0  # an hour not gone by
    time.sleep(1.5)  # the tombstones expire: the next checkpoint leaves them out
    later = {"delta.logRetentionDuration": "interval 30 days"}
    lake.open(table).alter.set_table_properties(later)  # a new version, no file
    lake.open(table).create_checkpoint()  # as a writer's checkpointer does, every 100
    live = {Path(uri).name for uri in lake.open(table).file_uris()}
    second = maintain_table(lake, table, retention_hours=0, full_vacuum=True)
    assert second.files_vacuumed == 5
    assert {p.name for p in root.glob("*.parquet")} == live
    assert _messages(lake, table) == sorted(unified_rows(0, 50).column("message").to_pylist())
