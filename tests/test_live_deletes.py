"""Another writer's delete and merge commit on an input while the producer streams into it.

The producer commits every 100 ms. Under Serializable isolation every one of those commits
fails a delete begun before it, so at that pace a delete never lands. deltabus' tables are
write-serializable and its appends are blind, so a delete or a merge commits at once.
The ETL, the DuckDB views and the served PostgreSQL table then all show it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus.adapters.serving.compare import compare
from deltabus.adapters.serving.postgres_sink import PostgresSink, ServeConfig
from deltabus.apps.timezones.producer import ProducerConfig, ProducerReport, TimezoneProducer
from deltabus.delta.lake import Lake
from tests.pg_fixture import Postgres
from tests.test_foreign_writers import (
    assert_content_checks_pass,
    start_etl,
    stop_etl,
    wait_for_net,
)

RATE = 10_000
SECONDS = 20
COMMIT_WITHIN_S = 5.0
NEW_DATE = "2026-01-02 03:04:05.000000 -0500"


def messages(dt: DeltaTable) -> list[str]:
    return dt.to_pyarrow_table(columns=["message"]).column("message").to_pylist()


def _timed(what: str, fn) -> float:  # noqa: ANN001 - a callable of no arguments
    started = time.monotonic()
    fn()
    took = time.monotonic() - started
    print(f"{what} committed in {took:.2f} s while the producer streamed")
    return took


def test_delete_and_merge_commit_while_the_producer_streams(
    minio_lake: Lake, postgres: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = minio_lake
    etl = start_etl(lake, tmp_path)
    config = ProducerConfig(rate=RATE, count=RATE * SECONDS, commit_interval=0.1, run_id="live")
    reports: list[ProducerReport] = []
    producer = threading.Thread(target=lambda: reports.append(TimezoneProducer(lake, config).run()))
    producer.start()
    try:
        time.sleep(5)
        paris = lake.open("timezone2")
        # Rows of the snapshot the delete reads: rows appended meanwhile it leaves alone.
        doomed = messages(paris)[:7]
        predicate = " OR ".join(f"message = '{m}'" for m in doomed)
        deleted: list[dict] = []
        took_delete = _timed("delete()", lambda: deleted.append(paris.delete(predicate)))
        assert deleted[0]["num_deleted_rows"] == len(doomed), deleted

        york = lake.open("timezone1")
        changed = messages(york)[:5]
        source = pa.table({"message": changed, "date": [NEW_DATE] * len(changed)})
        took_merge = _timed(
            "merge()",
            lambda: (
                york.merge(source, "target.message = source.message", "source", "target")
                .when_matched_update({"date": "source.date"})
                .execute()
            ),
        )
        assert producer.is_alive(), "the producer finished before the delete and the merge"
    finally:
        producer.join()
    assert reports and reports[0].messages == RATE * SECONDS
    assert took_delete < COMMIT_WITHIN_S and took_merge < COMMIT_WITHIN_S

    expected = wait_for_net(lake, etl, timeout=120)
    assert not set(doomed) & set(expected)
    new_ms = 1767341045000.0  # NEW_DATE in epoch milliseconds
    assert all(expected[m] == new_ms for m in changed)
    assert len(expected) == RATE * SECONDS - len(doomed)
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]

    assert_content_checks_pass(lake, monkeypatch)  # DuckDB over the unified table
    PostgresSink(lake, postgres.dsn, ServeConfig(table="live_deletes", follow=False)).run()
    diff = compare(lake, postgres.dsn, "live_deletes")
    assert diff["missing"] == diff["extra"] == diff["timestamp_mismatches"] == 0, diff
    assert diff["served_rows"] == len(expected), diff
