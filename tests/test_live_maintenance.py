"""Another process's compaction, checkpoint and log cleanup never stop a live writer.

A long-lived table handle refers to the log files of the version it was loaded at; once
someone else's checkpoint made them expendable and log cleanup removed them, reading an
app transaction through that handle fails. These tests remove them for real (delta-rs on
the MinIO fixture), then go on appending and reading positions and epochs.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA
from deltabus.bus.fence import EPOCH_APP_ID, claim
from deltabus.delta.append import TableAppender
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table
from tests.conftest import lake_env, minio_settings_for, run_cli
from tests.helpers import unified_rows

SHORT_RETENTION = {"delta.logRetentionDuration": "interval 1 seconds"}


def _log_names(lake: Lake, table: str) -> list[str]:
    prefix = f"{lake.settings.prefix}/{table}/_delta_log/"
    listing = lake.s3_client().list_objects_v2(Bucket=lake.settings.bucket, Prefix=prefix)
    return sorted(obj["Key"][len(prefix) :] for obj in listing.get("Contents", []))


def _maintain_elsewhere(lake: Lake, table: str) -> None:
    """What a maintenance job in another process does: compact, checkpoint, clean the log."""
    other = lake.open(table)
    other.optimize.compact()
    time.sleep(1.5)  # every log file so far is now older than the retention
    other.create_checkpoint()
    other.cleanup_metadata()


def test_appender_keeps_committing_after_another_process_cleans_the_log(
    minio_lake: Lake,
) -> None:
    table = "live_table"
    dt = ensure_table(minio_lake, table, UNIFIED_SCHEMA)
    dt.alter.set_table_properties(SHORT_RETENTION)
    lease = claim(minio_lake.open(table), table, UNIFIED_SCHEMA, mode="test")
    appender = TableAppender(minio_lake, table, minio_lake.open(table))
    assert appender.fast
    for seq in range(5):
        assert appender.append_once(
            unified_rows(seq * 10, 10), app_id="writer", seq=seq, custom_metadata={}, what="append"
        )

    _maintain_elsewhere(minio_lake, table)
    names = _log_names(minio_lake, table)
    assert "00000000000000000000.json" not in names, names
    assert any(name.endswith(".checkpoint.parquet") for name in names), names

    # The compaction took the version this appender would write next: it reads that
    # commit, checks its position and its epoch, and lands on top.
    for seq in range(5, 8):
        assert appender.append_once(
            unified_rows(seq * 10, 10),
            app_id="writer",
            seq=seq,
            custom_metadata={},
            what="append",
            fence=lease.check,
        )
    lease.check(appender)  # reads the epoch: through a stale handle this raised
    assert appender.transaction_version("writer") == 7
    assert appender.transaction_version(EPOCH_APP_ID) == lease.epoch
    assert appender.transaction_version("nobody") is None

    fresh = DeltaTable(minio_lake.uri(table), storage_options=minio_lake.storage_options)
    messages = fresh.to_pyarrow_table(columns=["message"]).column("message").to_pylist()
    assert sorted(messages) == sorted(f"m{i}" for i in range(80))
    assert fresh.transaction_version("writer") == 7


@pytest.mark.slow
def test_soak_with_maintenance_and_short_log_retention(minio: MinioServer, tmp_path: Path) -> None:
    """The documented soak: 30 s log retention, a maintenance pass every 20 s in its own
    process; the producer and the ETL run through every pass, nothing lost."""
    lake = Lake(minio_settings_for(minio, f"soak-{uuid.uuid4().hex[:8]}", log_retention_s=30))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "75", "--warmup", "5", "--soak"]
    args += ["--maintenance-interval", "20", "--profile", "100ms", "--out", str(out)]
    args += ["--no-local-minio", "--grace", "30"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]

    run = json.loads((out / "runs" / "delta-2000.json").read_text())
    assert run["errors"] == [], run["errors"]
    assert run["lost"] == 0 and run["samples"] == run["messages"] == 140_000, run
    soak = run["soak"]
    # What the run did, not how fast: passes ran while the producer was writing (it writes
    # from 0 s to the run's 75 s), each ended with no error, and the producer ran on
    # through each, losing nothing (checked above).
    assert soak["maintenance_passes"] >= 2 and not soak["maintenance_errors"], soak
    during = [at for at in soak["maintenance_at_s"] if at < 75]
    assert len(during) >= 2, soak
    assert len(soak["maintenance_duration_s"]) == soak["maintenance_passes"], soak
    # One ETL process from start to end: it resumed from nothing, never from a restart.
    assert [r["resumed_from"] for r in run["etl_reports"]] == [
        {"timezone1": -1, "timezone2": -1}
    ], run["etl_reports"]
    # The maintenance's checkpoints really removed the log files the run started from.
    run_lake = Lake(lake.settings.with_prefix(run["lake_prefix"]))
    for table in ("timezone1", "timezone2", "timezone_unified"):
        assert "00000000000000000000.json" not in _log_names(run_lake, table), table
