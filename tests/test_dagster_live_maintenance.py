"""Dagster's hourly `maintenance_job` run against a live pipeline: the producer and the
continuous ETL keep running through compaction, checkpoints and log cleanup, exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_TABLE
from deltabus.apps.timezones.producer import ProducerConfig, ProducerReport, TimezoneProducer
from deltabus.delta.lake import Lake
from tests.conftest import minio_settings_for, use_lake_env
from tests.helpers import assert_exactly_once
from tests.test_foreign_writers import start_etl, stop_etl, wait_for_net
from tests.test_live_maintenance import _log_names

RATE = 4000
SECONDS = 30
RETENTION_S = 10


def test_maintenance_job_on_a_live_pipeline(
    minio: MinioServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from definitions import build_definitions
    from resources import default_resources

    settings = minio_settings_for(minio, f"live-{time.time_ns()}", log_retention_s=RETENTION_S)
    lake = Lake(settings)
    use_lake_env(monkeypatch, lake)
    job = build_definitions(default_resources()).resolve_job_def("maintenance_job")
    etl = start_etl(lake, tmp_path, DELTABUS_LOG_RETENTION_S=str(RETENTION_S))
    config = ProducerConfig(rate=RATE, count=RATE * SECONDS, commit_interval=0.1, run_id="live")
    reports: list[ProducerReport] = []
    producer = threading.Thread(target=lambda: reports.append(TimezoneProducer(lake, config).run()))
    producer.start()
    passes = 0
    try:
        time.sleep(RETENTION_S + 2)  # the first commits are past the retention by the first pass
        while producer.is_alive() and passes < 3:
            result = job.execute_in_process(
                run_config={"ops": {"maintain_lake": {"config": {"retention_hours": 24}}}},
                instance=DagsterInstance.ephemeral(),
            )
            assert result.success
            passes += 1
            assert etl.poll() is None, stop_etl(etl)[1][-3000:]
            time.sleep(5)
    finally:
        producer.join()
    assert passes >= 2, "the producer finished before two maintenance passes"
    assert reports and reports[0].messages == RATE * SECONDS

    wait_for_net(lake, etl, timeout=120)
    assert etl.poll() is None, "the ETL stopped during maintenance"
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    assert_exactly_once(lake, expected=RATE * SECONDS)
    for table in (*INPUT_TABLES, UNIFIED_TABLE):
        assert "00000000000000000000.json" not in _log_names(lake, table), table
