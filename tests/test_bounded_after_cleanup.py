"""A bounded ETL started after another process's maintenance cleaned the logs still ends:
the producer run's finish is a mark in the input tables' app transactions, which
checkpoints keep, not only commit metadata, which log cleanup removes. Real MinIO, real
processes."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import obstore
import pytest

import deltabus
from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import FINISHED_MARK
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, minio_settings_for, run_cli
from tests.helpers import assert_exactly_once

pytestmark = pytest.mark.timeout(420)
LOG_RETENTION_S = 10  # the smallest the settings take

MAINTAIN = """
from deltabus.delta.lake import Lake
from deltabus.core.settings import Settings
from deltabus.delta.maintenance import maintain_table
lake = Lake(Settings())
for table in {tables!r}:
    maintain_table(lake, table, retention_hours=0)
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
    for table in ("timezone1", "timezone2"):
        assert deltabus.recorded_marks(lake, table, FINISHED_MARK) == {"r1": 1}

    first = run_cli(["etl", "--mode", "bounded", "--until-run", "r1"], env, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert_exactly_once(lake, expected=2000)

    # Another process compacts, checkpoints, cleans up the logs and vacuums every table
    # once everything is older than the log retention.
    time.sleep(LOG_RETENTION_S + 1)
    tables = ["timezone1", "timezone2", "timezone_unified"]
    maintained = subprocess.run(
        [sys.executable, "-c", MAINTAIN.format(tables=tables)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert maintained.returncode == 0, maintained.stderr[-2000:]
    for table in tables:
        assert "00000000000000000000.json" not in log_names(lake, table), table

    again = run_cli(["etl", "--mode", "bounded", "--until-run", "r1"], env, tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert_exactly_once(lake, expected=2000)
