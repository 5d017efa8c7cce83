"""A bounded ETL started after another process's maintenance cleaned the logs still ends:
the producer run's finish is a mark in the input tables' app transactions, which
checkpoints keep, not only commit metadata, which log cleanup removes. Tables written
before the mark existed end a bounded ETL by their commit metadata. Real MinIO, real
processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import obstore
import pyarrow as pa
import pytest

import deltabus
from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import FINISHED_MARK, INPUT_SCHEMA, INPUT_TABLES
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, minio_settings_for, run_cli
from tests.helpers import assert_exactly_once

pytestmark = pytest.mark.timeout(420)
LOG_RETENTION_S = 10  # the smallest the settings take
FIRST_LOG_ENTRY = "00000000000000000000.json"

# The unified table is no declared stream: the Dagster maintenance job maintains it so.
MAINTAIN_UNIFIED = """
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake
from deltabus.delta.maintenance import maintain
maintain(Lake(Settings()), ("timezone_unified",), retention_hours=0)
"""


def log_names(lake: Lake, table: str) -> list[str]:
    listed = obstore.list(lake.object_store, prefix=f"{table}/_delta_log/")
    return sorted(str(m["path"]).rsplit("/", 1)[-1] for chunk in listed for m in chunk)


def test_bounded_etl_ends_after_the_input_logs_were_cleaned(
    minio: MinioServer, tmp_path: Path
) -> None:
    lake = Lake(
        minio_settings_for(
            minio, f"cleaned-{uuid.uuid4().hex[:8]}", log_retention_s=LOG_RETENTION_S
        )
    )
    env = lake_env(lake)
    produce = ["produce", "--count", "2000", "--rate", "4000", "--commit-interval-ms", "50"]
    result = run_cli([*produce, "--run-id", "r1"], env, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    # Each input partition records the run's finish as a mark, beside its positions.
    for table in INPUT_TABLES:
        assert deltabus.recorded_marks(lake, table, FINISHED_MARK) == {"r1": 1}

    first = run_cli(["etl", "--mode", "bounded", "--until-run", "r1"], env, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert_exactly_once(lake, expected=2000)

    # Other processes compact, checkpoint, clean up the logs and vacuum every table once
    # everything is older than the log retention: the inputs with `deltabus streams
    # maintain`, the unified table as the Dagster maintenance job does.
    time.sleep(LOG_RETENTION_S + 1)
    maintained = run_cli(["streams", "maintain", "--vacuum-retention-hours", "0"], env, tmp_path)
    assert maintained.returncode == 0, maintained.stderr[-2000:]
    passes = {t["table"]: t for s in json.loads(maintained.stdout)["streams"] for t in s["tables"]}
    for table in INPUT_TABLES:
        assert passes[table]["files_compacted"] > 0, passes[table]
    unified = subprocess.run(
        [sys.executable, "-c", MAINTAIN_UNIFIED],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert unified.returncode == 0, unified.stderr[-2000:]
    for table in (*INPUT_TABLES, "timezone_unified"):
        assert FIRST_LOG_ENTRY not in log_names(lake, table), table

    again = run_cli(["etl", "--mode", "bounded", "--until-run", "r1"], env, tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert_exactly_once(lake, expected=2000)


def test_bounded_etl_ends_on_commit_metadata_of_tables_written_before_the_mark(
    minio: MinioServer, tmp_path: Path
) -> None:
    lake = Lake(minio_settings_for(minio, f"premark-{uuid.uuid4().hex[:8]}"))
    env = lake_env(lake)
    bus = deltabus.Bus(lake)
    for i, table in enumerate(INPUT_TABLES):
        bus.create_stream(table, INPUT_SCHEMA)
        rows = pa.table(
            {
                "date": ["2026-11-28 08:00:00.000000 -0500"] * 100,
                "message": [f"old-{i}-{n}" for n in range(100)],
            },
            schema=INPUT_SCHEMA,
        )
        with bus.producer(table, "old") as producer:
            producer.send_batch(rows)
            producer.flush({"producer.run_id": "old", "producer.finished": True}, everywhere=True)
        assert deltabus.recorded_marks(lake, table, FINISHED_MARK) == {}

    # From the commit metadata the tail reads, then from the history of what it read.
    for _ in range(2):
        etl = run_cli(
            ["etl", "--mode", "bounded", "--until-run", "old"], env, tmp_path, timeout=120
        )
        assert etl.returncode == 0, etl.stderr[-2000:]
        assert_exactly_once(lake, expected=200)
