"""The code location loads, names what the docs promise, keeps secrets out of config,
and the maintenance job works on a real lake."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, Definitions, EnvVar

from deltabus.apps.timezones.contracts import INPUT_TABLES
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.delta.lake import Lake
from tests.conftest import clear_lake_env, use_lake_env

REPO = Path(__file__).resolve().parents[1]


def test_definitions_load_without_warnings_and_validate():
    # A fresh interpreter with every warning an error: nothing deprecated, beta or preview.
    code = (
        "import definitions; from dagster import Definitions; "
        "Definitions.validate_loadable(definitions.defs); print('ok')"
    )
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_everything_the_docs_name_is_defined():
    from definitions import defs

    Definitions.validate_loadable(defs)
    specs = {s.key.to_user_string(): s for s in defs.resolve_all_asset_specs()}
    assert set(specs) == {
        "timezone1",
        "timezone2",
        "timezone_unified",
        "results_csv",
        "latency_percentiles",
        "benchmark_report",
        "served_unified",
        "indexed_unified",
        "declared_streams",
    }
    assert {d.asset_key.to_user_string() for d in specs["timezone_unified"].deps} == set(
        INPUT_TABLES
    )
    assert specs["timezone1"].group_name == "pipeline" and "deltalake" in specs["timezone1"].kinds
    jobs = {j.name for j in defs.resolve_all_job_defs()} - {"__ASSET_JOB"}
    assert jobs == {
        "pipeline_job",
        "producer_run_job",
        "benchmark_job",
        "maintenance_job",
        "etl_service_start_job",
        "etl_service_stop_job",
    }
    pipeline = defs.resolve_job_def("pipeline_job")
    checks = {k.name for k in pipeline.asset_layer.asset_graph.asset_check_keys}
    assert {"no_message_lost", "no_duplicate_message", "no_nulls"} <= checks
    per_run = defs.resolve_job_def("producer_run_job")
    assert per_run.partitions_def is not None and per_run.partitions_def.name == "producer_runs"
    per_run_checks = {k.name for k in per_run.asset_layer.asset_graph.asset_check_keys}
    assert {"no_message_lost", "schema_matches_contract", "p99_within_limit"} <= per_run_checks
    graph = defs.resolve_asset_graph()
    blocking = {k.name for k in graph.asset_check_keys if graph.get_check_spec(k).blocking}
    assert blocking == {"no_message_lost", "no_duplicate_message", "schema_matches_contract"}
    schedules = {s.name: s for s in defs.schedules}
    assert schedules["nightly_benchmark_schedule"].cron_schedule == "0 3 * * *"
    assert schedules["nightly_benchmark_schedule"].job_name == "benchmark_job"
    assert schedules["hourly_maintenance_schedule"].cron_schedule == "0 * * * *"
    assert {s.name for s in defs.sensors} == {
        "unified_commits_sensor",
        "etl_service_sensor",
        "streams_sensor",
    }
    assert specs["declared_streams"].partitions_def is not None
    stream_checks = {
        k.name for k in graph.asset_check_keys if k.asset_key.path == ["declared_streams"]
    }
    assert stream_checks == {"consumer_groups_within_lag"}


def test_s3_resource_takes_credentials_from_env_var_names(monkeypatch: pytest.MonkeyPatch):
    from resources.s3 import minio_s3_resource

    clear_lake_env(monkeypatch)
    monkeypatch.setenv("MINIO_S3_ACCESS_KEY", "from-pathway-env")
    monkeypatch.setenv("MINIO_S3_SECRET_ACCESS_KEY", "not-in-config-please")
    s3 = minio_s3_resource()
    assert s3.aws_access_key_id == EnvVar("MINIO_S3_ACCESS_KEY")
    assert s3.aws_secret_access_key == EnvVar("MINIO_S3_SECRET_ACCESS_KEY")
    monkeypatch.setenv("DELTABUS_SECRET_KEY", "the-engine-name-wins")
    monkeypatch.setenv("DELTABUS_MINIO_ENDPOINT", "http://127.0.0.1:9999")
    s3 = minio_s3_resource()
    assert s3.aws_secret_access_key == EnvVar("DELTABUS_SECRET_KEY")
    assert s3.endpoint_url == EnvVar("DELTABUS_MINIO_ENDPOINT") and s3.use_ssl is False
    assert "the-engine-name-wins" not in repr(s3) and "not-in-config-please" not in repr(s3)


def test_lake_resource_resolves_like_the_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from resources import LakeResource

    monkeypatch.setenv("DELTABUS_STORAGE", "local")
    monkeypatch.setenv("DELTABUS_LOCAL_ROOT", str(tmp_path))
    monkeypatch.setenv("DELTABUS_PREFIX", "base")
    lake = LakeResource(prefix="other").lake()
    assert lake.root == str(tmp_path / "other")
    env = LakeResource(prefix="other").subprocess_env()
    assert env["DELTABUS_PREFIX"] == "other" and env["DELTABUS_LOCAL_ROOT"] == str(tmp_path)


def test_maintenance_job_compacts_and_reports(minio_lake: Lake, monkeypatch: pytest.MonkeyPatch):
    from definitions import build_definitions
    from resources import default_resources

    use_lake_env(monkeypatch, minio_lake)
    TimezoneProducer(minio_lake, ProducerConfig(rate=5000, count=2000, run_id="maint")).run()
    versions = {t: minio_lake.open(t).version() for t in INPUT_TABLES}
    job = build_definitions(default_resources()).resolve_job_def("maintenance_job")
    result = job.execute_in_process(
        run_config={"ops": {"maintain_lake": {"config": {"retention_hours": 0}}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    observations = {
        obs.asset_key: obs
        for obs in (
            e.asset_observation_data.asset_observation
            for e in result.all_events
            if e.event_type_value == "ASSET_OBSERVATION"
        )
    }
    for table in INPUT_TABLES:
        obs = observations[AssetKey(table)].metadata
        assert obs["files_compacted"].value > 1  # the producer left one file per commit
        assert obs["delta_version"].value > versions[table]
        assert obs["objects"].value > 0 and obs["bytes"].value > 0  # listed through S3Resource
        assert minio_lake.open(table).to_pyarrow_table().num_rows > 0
