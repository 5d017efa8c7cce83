"""`deltabus bench --etl spark`: Spark Structured Streaming as the peer ETL, end to end.

The Spark tests run with `make spark` (which installs pyspark + delta-spark and the jars);
elsewhere they are skipped unless DELTABUS_SPARK_REQUIRED=1, which makes a missing Spark a
failure. The refusals need no Spark. Speed is not asserted: consistency is (every message
after the warm-up seen once, none lost, every stage measured, the ETL's CPU counted).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.etl import dates
from deltabus.delta.lake import Lake
from deltabus_bench.delta.spark_etl import missing, transform
from tests.conftest import lake_env, minio_settings_for, run_cli
from tests.test_dates import CASES, UNUSUAL

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

REQUIRED = os.environ.get("DELTABUS_SPARK_REQUIRED") == "1"
STAGES = ("sent_to_input_commit", "input_commit_to_etl", "etl_to_unified_commit")


def require_spark() -> None:
    why = missing()
    if why is not None:
        if REQUIRED:
            pytest.fail(f"the Spark benchmark test must run here, but {why}")
        pytest.skip(f"Delta Spark is not set up ({why}); `make spark` runs this test")


@pytest.fixture(scope="module")
def spark() -> Iterator:
    """A plain local Spark session (the transform needs neither Delta nor s3a)."""
    require_spark()
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("deltabus-spark-transform")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_spark_transform_agrees_with_the_date_grammar(spark) -> None:
    """Every case of the contract's date grammar: the Spark ETL keeps exactly the dates
    deltabus' ETL accepts, each with the same epoch-ms double, and drops the others."""
    values = [v for v, _ in CASES] + UNUSUAL + ["2026-11-26 15:20:01.123456 +0100"]
    frame = spark.createDataFrame(
        [(v, f"m{i}", 1) for i, v in enumerate(values)], "date string, message string, diff long"
    )
    rows = {r["message"]: r for r in transform(frame).collect()}
    checked = dates.check_dates(pl.Series(values, dtype=pl.String))
    for i, value in enumerate(values):
        got = rows.get(f"m{i}")
        if checked["reason"][i] is not None:
            assert got is None, (value, checked["reason"][i])
            continue
        canonical = pa.array([checked["canonical"][i]])
        expected = float(dates.epoch_ms(dates.epoch_ns(canonical))[0])
        assert got is not None, value
        assert got["timestamp"] == expected, (value, got["timestamp"], expected)
        assert got["diff"] == 1 and got["time"] > 1_700_000_000_000  # epoch ms, per row


def test_bench_smoke_spark_etl(minio: MinioServer, tmp_path: Path) -> None:
    """2000 msg/s for 20 s (5 s warm-up) through the Spark ETL: every message after the
    warm-up seen once, none lost, every stage measured, the JVM's CPU as the ETL's."""
    require_spark()
    lake = Lake(minio_settings_for(minio, f"bench-spark-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--etl", "spark", "--rates", "2000", "--duration", "20", "--warmup", "5"]
    # A generous grace: a micro-batch of a JVM starved on a shared 2-core machine has
    # taken over 30 s.
    args += ["--profile", "1000ms", "--out", str(out), "--no-local-minio", "--grace", "120"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (run,) = report["runs"]
    print(json.dumps({k: run[k] for k in ("p50", "p99", "max", "verdict", "stages", "cost")}))
    assert run["etl"] == "spark" and run["backbone"] == "delta"
    assert run["messages"] == 2000 * 15 and run["samples"] == run["messages"], run
    assert run["lost"] == 0, run
    assert run["cost"]["cpu_s_per_million_msgs"]["etl"] > 0, run["cost"]
    assert set(run["stages"]) == {*STAGES, "unified_commit_to_seen"}
    for stage in run["stages"].values():
        assert stage["p50"] is not None and stage["p99"] is not None, run["stages"]
    detail = json.loads((out / "runs" / "delta-2000.json").read_text())
    assert detail["errors"] == [], detail["errors"]
    checks = detail["checks"]
    assert checks["produced_rows"] == 2000 * 20
    assert checks["duplicate_rows_seen"] == 0 and checks["retractions_seen"] == 0, checks
    assert checks["parsed_timestamp_mismatches"] == 0, checks
    (etl,) = detail["etl_reports"]
    assert etl["etl"] == "spark" and etl["trigger_ms"] == 1000
    assert etl["sources"] == {"timezone1": "change data feed", "timezone2": "change data feed"}
    assert etl["micro_batches"] >= 2  # the start (empty tables), then the messages
    md = (out / "report.md").read_text()
    assert "- ETL: **spark** (Spark Structured Streaming" in md
    assert "deltabus + Spark ETL commit 1000ms p50 / p99 (s)" in md


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--etl", "spark", "--partitions", "2"], "--partitions > 1 is not supported"),
        (["--etl", "spark", "--backbone", "kafka"], "--backbone kafka/both is not supported"),
        (["--etl", "spark", "--backlog-drain", "5", "--duration", "60"], "--backlog-drain"),
        (["--etl", "spark", "--layouts", "1x1,2x2"], "--layouts is not supported"),
        (["--etl", "flink"], "--etl 'flink' is not one of pathway, spark"),
    ],
)
def test_bench_etl_refused_before_any_run(tmp_path: Path, extra: list[str], message: str) -> None:
    env = {**os.environ, "DELTABUS_ENV_FILE": "/dev/null"}
    out = tmp_path / "out"
    result = run_cli(["bench", "--out", str(out), "--no-local-minio", *extra], env, tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr, result.stderr[-2000:]
    assert not (out / "report.json").exists()
