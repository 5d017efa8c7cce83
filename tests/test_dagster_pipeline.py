"""The Dagster layer end to end on the real MinIO fixture: the whole asset graph in process
(the ETL as a real Pipes subprocess), then faults planted in timezone_unified with delta-rs
and the checks that must name them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, AssetKey, DagsterInstance, materialize
from deltalake import write_deltalake

from deltabus.apps.timezones.contracts import REJECTS_SCHEMA, REJECTS_TABLE, UNIFIED_TABLE
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table
from tests.conftest import lake_env, minio_settings_for
from tests.helpers import assert_exactly_once

RATE, DURATION = 2000, 2.0  # 4000 messages
PRODUCER_RUN = "dgrun"  # the partition of latency_percentiles


def dagster_env(lake: Lake, tmp: Path) -> dict[str, str]:
    """The process environment a Dagster run against `lake` sees (resources read it)."""
    env = lake_env(lake)
    env["DELTABUS_SERVICE_DIR"] = str(tmp / "service")
    return env


@pytest.fixture(scope="module")
def module_env(minio_lake_module: Lake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("dagster")
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(dagster_env(minio_lake_module, tmp))
    try:
        yield {"lake": minio_lake_module, "tmp": tmp}
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def minio_lake_module(minio) -> Lake:
    """A fresh prefix on the session's MinIO, shared by this module's tests."""
    return Lake(minio_settings_for(minio, f"dg-{uuid.uuid4().hex[:10]}"))


def run_config(tmp: Path, **latency: object) -> dict:
    return {
        "ops": {
            "stream_window": {
                "config": {
                    "rate": RATE,
                    "duration_s": DURATION,
                    "commit_interval_ms": 100,
                    "run_id": PRODUCER_RUN,
                }
            },
            "results_csv": {"config": {"path": str(tmp / "results.csv")}},
            "latency_percentiles": {"config": {"warmup_s": 0.5, "plot_dir": str(tmp / "plots")}},
            **({"latency_percentiles_p99_within_limit": {"config": latency}} if latency else {}),
        }
    }


@pytest.fixture(scope="module")
def pipeline(module_env) -> dict:
    """The full asset graph, materialized once in process against MinIO."""
    from assets.latency.assets import latency_percentiles, p99_within_limit
    from assets.pipeline.assets import results_csv, stream_window
    from assets.pipeline.checks import UNIFIED_CHECKS
    from resources import default_resources

    tmp = module_env["tmp"]
    instance = DagsterInstance.ephemeral()
    config = run_config(tmp)
    # The service health checks judge the continuous service, which is not in use here.
    window = materialize(
        [stream_window, results_csv, *UNIFIED_CHECKS],
        resources=default_resources(),
        run_config={"ops": {k: config["ops"][k] for k in ("stream_window", "results_csv")}},
        instance=instance,
    )
    # The stream window added its producer run as a partition; measure that partition.
    assert PRODUCER_RUN in instance.get_dynamic_partitions("producer_runs")
    latency = materialize(
        [latency_percentiles, p99_within_limit],
        resources=default_resources(),
        run_config={"ops": {"latency_percentiles": config["ops"]["latency_percentiles"]}},
        partition_key=PRODUCER_RUN,
        instance=instance,
    )
    lake: Lake = module_env["lake"]
    return {
        "result": window,
        "latency": latency,
        "instance": instance,
        "lake": lake,
        "tmp": tmp,
        "good_version": lake.open(UNIFIED_TABLE).version(),
    }


def metadata_of(result, asset: str) -> dict:
    mats = [
        e.event_specific_data.materialization
        for e in result.get_asset_materialization_events()
        if e.event_specific_data.materialization.asset_key == AssetKey(asset)
    ]
    assert len(mats) == 1, f"{asset}: {len(mats)} materializations"
    return {k: getattr(v, "value", v) for k, v in mats[0].metadata.items()}


def checks_of(result) -> dict:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_full_graph_materializes_and_every_check_passes(pipeline):
    result, lake = pipeline["result"], pipeline["lake"]
    assert result.success and pipeline["latency"].success
    total = int(RATE * DURATION)
    assert_exactly_once(lake, expected=total)

    t1, t2 = metadata_of(result, "timezone1"), metadata_of(result, "timezone2")
    assert t1["rows_written"] + t2["rows_written"] == total
    assert t1["table_rows"] == t1["rows_written"] and t1["achieved_rate_msg_s"] > 0
    assert {"commits_both_tables", "max_lag_s", "delta_version"} <= set(t1)

    unified = metadata_of(result, UNIFIED_TABLE)  # reported by the ETL process through Pipes
    assert unified["rows"] == total and unified["rejected_rows"] == 0
    assert unified["mode"] == "streaming"
    assert unified["delta_version"] == lake.open(UNIFIED_TABLE).version()
    assert unified["throughput_rows_s"] > 0 and unified["table_rows"] == total

    csv = metadata_of(result, "results_csv")
    assert csv["rows"] == total
    assert Path(csv["path"]).read_text().splitlines()[0] == "timestamp,message,time,diff"

    latency = metadata_of(pipeline["latency"], "latency_percentiles")
    assert 0 < latency["samples"] < total  # the warm-up was left out
    assert 0 < latency["p50_s"] <= latency["p99_s"] <= latency["max_s"]
    # Streaming: the ETL transformed each commit as it landed, not after the 2 s run.
    assert latency["p50_s"] < 1.0, latency["percentiles_md"]
    assert latency["mode"] == "streaming"
    rows = {r.data["stage"].split(" (")[0]: r.data for r in latency["percentiles"].records}
    assert rows["end to end"]["p99_9_s"] >= rows["end to end"]["p50_s"] > 0
    assert {r["mode"] for r in rows.values()} == {"streaming"}
    assert "| end to end" in latency["percentiles_md"]
    assert Path(latency["latency_over_time"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert latency["scope"] == f"producer run {PRODUCER_RUN}"
    # Many commits behind each stage: distributions, so every percentile is filled in.
    assert all(r["events"] > 1 and r["p50_s"] is not None for r in rows.values()), rows

    checks = {**checks_of(result), **checks_of(pipeline["latency"])}
    assert set(checks) == {
        "no_message_lost",
        "no_duplicate_message",
        "no_nulls",
        "timestamp_in_producer_window",
        "schema_matches_contract",
        "rejects_count",
        "p99_within_limit",
    }
    failed = {n: (c.description, c.metadata) for n, c in checks.items() if not c.passed}
    assert not failed


def test_no_secret_in_events_or_metadata(pipeline):
    secret = pipeline["lake"].settings.secret_key.get_secret_value()
    for event in [*pipeline["result"].all_events, *pipeline["latency"].all_events]:
        assert secret not in str(event)


# -- faults planted in the real unified table ------------------------------------------


@pytest.fixture
def faulty(pipeline) -> Iterator[dict]:
    """The good lake; afterwards timezone_unified is restored and rejects removed."""
    lake: Lake = pipeline["lake"]
    yield pipeline
    lake.open(UNIFIED_TABLE).restore(pipeline["good_version"])
    if lake.exists(REJECTS_TABLE):
        lake.open(REJECTS_TABLE).delete()


def run_checks(pipeline, **latency_limit: object):
    """producer_run_job for the pipeline's producer run: every check, then the latency
    (which a failed blocking check holds back, so the run then fails)."""
    from definitions import build_definitions
    from resources import default_resources

    job = build_definitions(default_resources()).resolve_job_def("producer_run_job")
    config = run_config(pipeline["tmp"], **latency_limit)
    skipped = ("stream_window", "results_csv")
    config["ops"] = {k: v for k, v in config["ops"].items() if k not in skipped}
    result = job.execute_in_process(
        run_config=config,
        instance=pipeline["instance"],
        partition_key=PRODUCER_RUN,
        raise_on_error=False,
    )
    return checks_of(result), result


def md(check, key: str) -> object:
    return getattr(check.metadata[key], "value", check.metadata[key])


def unified_rows(lake: Lake) -> pa.Table:
    return lake.open(UNIFIED_TABLE).to_pyarrow_table()


def test_deleted_rows_are_reported_lost(faulty):
    lake = faulty["lake"]
    victims = sorted(unified_rows(lake)["message"].to_pylist())[:3]
    lake.open(UNIFIED_TABLE).delete(" OR ".join(f"message = '{m}'" for m in victims))
    checks, run = run_checks(faulty)
    lost = checks["no_message_lost"]
    assert not lost.passed and lost.severity == AssetCheckSeverity.ERROR
    # Blocking: the run fails and the latency of a table that lost rows is not published.
    assert not run.success
    assert not run.get_asset_materialization_events()
    assert md(lost, "lost_messages") == 3
    assert "3 of 4000 input messages are missing" in lost.description
    for m in victims:
        assert m in md(lost, "lost_examples")
    assert checks["no_duplicate_message"].passed and checks["no_nulls"].passed


def test_duplicated_rows_are_reported(faulty):
    lake = faulty["lake"]
    rows = unified_rows(lake).slice(0, 2)
    write_deltalake(
        lake.uri(UNIFIED_TABLE), rows, mode="append", storage_options=lake.storage_options
    )
    checks, run = run_checks(faulty)
    assert not run.success
    dup = checks["no_duplicate_message"]
    assert not dup.passed
    assert md(dup, "duplicated_messages") == 2 and md(dup, "extra_rows") == 2
    assert "2 messages are duplicated" in dup.description
    for m in rows["message"].to_pylist():
        assert m in md(dup, "examples")
    assert checks["no_message_lost"].passed  # nothing is missing


def test_corrupted_rows_fail_nulls_and_time_window(faulty):
    lake = faulty["lake"]
    table = unified_rows(lake)
    victim, shifted = table["message"][0].as_py(), table["message"][1].as_py()
    dt = lake.open(UNIFIED_TABLE)
    dt.update(predicate=f"message = '{victim}'", updates={"timestamp": "NULL"})
    dt = lake.open(UNIFIED_TABLE)
    dt.update(predicate=f"message = '{shifted}'", updates={"timestamp": "timestamp + 86400000"})
    checks, run = run_checks(faulty)
    assert run.success  # nulls and the time window are not blocking

    nulls = checks["no_nulls"]
    assert not nulls.passed
    assert "timestamp (1 rows)" in nulls.description
    assert md(nulls, "nulls_timestamp") == 1 and md(nulls, "nulls_message") == 0
    assert victim in md(nulls, "examples")

    window = checks["timestamp_in_producer_window"]
    assert not window.passed
    assert md(window, "rows_outside_window") == 2  # the shifted row and the null one
    assert shifted in md(window, "examples")
    assert checks["no_message_lost"].passed and checks["schema_matches_contract"].passed


def test_schema_drift_is_reported(faulty):
    lake = faulty["lake"]
    extra = unified_rows(lake).slice(0, 1)
    extra = extra.append_column("note", pa.array(["drift"], pa.string()))
    extra = extra.set_column(1, "message", pa.array(["drift-0"], pa.string()))
    write_deltalake(
        lake.uri(UNIFIED_TABLE),
        extra,
        mode="append",
        schema_mode="merge",
        storage_options=lake.storage_options,
    )
    checks, run = run_checks(faulty)
    assert not run.success
    schema = checks["schema_matches_contract"]
    assert not schema.passed
    assert "note: expected absent, got VARCHAR" in schema.description
    assert not checks["timestamp_in_producer_window"].passed  # drift-0 is no producer's


def test_rejects_warn_and_latency_limit_fails(faulty):
    lake = faulty["lake"]
    ensure_table(lake, REJECTS_TABLE, REJECTS_SCHEMA)
    bad = pa.table(
        {
            "date": ["not a date"],
            "message": ["bad-1"],
            "raw": ['{"date": "not a date"}'],
            "source_table": ["timezone1"],
            "source_version": [3],
            "reason": ["unparsable date"],
            "time": [0],
        },
        schema=REJECTS_SCHEMA,
    )
    write_deltalake(
        lake.uri(REJECTS_TABLE), bad, mode="append", storage_options=lake.storage_options
    )
    checks, _ = run_checks(faulty, p99_limit_s=0.001)
    rejects = checks["rejects_count"]
    assert not rejects.passed and rejects.severity == AssetCheckSeverity.WARN
    assert md(rejects, "rejected_rows") == 1 and "unparsable date" in md(rejects, "by_reason")
    p99 = checks["p99_within_limit"]
    assert not p99.passed and "exceeds the limit of 0.001s" in p99.description
    assert md(p99, "p99_s") > 0.001
    assert all(checks[n].passed for n in ("no_message_lost", "no_duplicate_message", "no_nulls"))
