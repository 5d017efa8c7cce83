"""End to end on a real MinIO and a local directory: producer -> Pathway ETL -> unified."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus.apps.timezones.contracts import TABLE_ZONES
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli
from tests.helpers import (
    DATE_FORMAT,
    assert_exactly_once,
    epoch_ms,
    etl_process,
    read_inputs,
    wait_for_file,
)


def assert_timestamps_true(lake: Lake, unified: pl.DataFrame) -> pl.DataFrame:
    """`timestamp` equals the true epoch ms of `date`, and `date` is the right local time."""
    inputs = read_inputs(lake)
    joined = inputs.join(unified, on="message", how="inner")
    assert joined.height == inputs.height
    for row in joined.iter_rows(named=True):
        truth = epoch_ms(row["date"])
        assert row["timestamp"] == pytest.approx(truth, abs=1e-3), row
        zone = ZoneInfo(TABLE_ZONES[row["source"]])
        local = datetime.fromtimestamp(truth / 1000, UTC).astimezone(zone)
        assert local.strftime(DATE_FORMAT) == row["date"], row
    return joined


def test_end_to_end_exactly_once_and_csv(lake: Lake, tmp_path: Path) -> None:
    report = TimezoneProducer(
        lake,
        ProducerConfig(rate=2000, count=3000, commit_interval=0.05, seed=7, run_id="e2e"),
    ).run()
    assert report.messages == 3000
    assert sum(report.per_table.values()) == 3000
    assert min(report.per_table.values()) > 1000  # both zones get a fair share
    assert 2 <= report.commits <= 2 * 31  # one commit per table per interval at most

    env = lake_env(lake)
    etl = run_cli(["--json", "etl", "--mode", "bounded"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-3000:]
    assert '"rows": 3000' in etl.stdout

    unified = assert_exactly_once(lake, expected=3000)
    assert unified.schema == {
        "timestamp": pl.Float64,
        "message": pl.String,
        "time": pl.Int64,
        "diff": pl.Int64,
    }
    joined = assert_timestamps_true(lake, unified)
    assert set(joined["source"]) == {"timezone1", "timezone2"}

    out = tmp_path / "out" / "results.csv"
    res = run_cli(["results", "--out", str(out)], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert out.read_text().splitlines()[0] == "timestamp,message,time,diff"
    csv = pl.read_csv(out, schema=unified.schema)
    assert csv["time"].is_sorted()
    expected = unified.sort(["time", "timestamp", "message"])
    assert csv.equals(expected)


def test_daylight_saving_changes_both_zones(minio_lake: Lake, tmp_path: Path) -> None:
    """Dates on both sides of New York's and Paris's 2026 spring changes parse correctly."""
    for run_id, start in (
        ("ny", "2026-03-08T06:59:59+00:00"),
        ("paris", "2026-03-29T00:59:59+00:00"),
    ):
        TimezoneProducer(
            minio_lake,
            ProducerConfig(
                rate=500,
                count=1000,
                commit_interval=0.5,
                run_id=run_id,
                start_us=int(datetime.fromisoformat(start).timestamp() * 1_000_000),
            ),
        ).run()
    etl = run_cli(["etl", "--producers", "2"], lake_env(minio_lake), tmp_path)
    assert etl.returncode == 0, etl.stderr[-3000:]
    unified = assert_exactly_once(minio_lake, expected=2000)
    joined = assert_timestamps_true(minio_lake, unified)
    offsets = {
        (row["source"], row["message"].split("-")[0], row["date"][-5:])
        for row in joined.iter_rows(named=True)
    }
    for source, run in (("timezone1", "ny"), ("timezone2", "paris")):
        seen = {off for s, r, off in offsets if s == source and r == run}
        winter, summer = ("-0500", "-0400") if source == "timezone1" else ("+0100", "+0200")
        assert seen == {winter, summer}, (source, seen)


def test_etl_started_first_waits_for_the_producer(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    ready = tmp_path / "ready"
    etl = etl_process(env, tmp_path, "--ready-file", str(ready))
    try:
        wait_for_file(ready, etl)
        assert not minio_lake.exists("timezone1")
        report = TimezoneProducer(
            minio_lake, ProducerConfig(rate=1000, count=1500, commit_interval=0.1, run_id="late")
        ).run()
        assert report.messages == 1500
        _, stderr = etl.communicate(timeout=120)
    finally:
        if etl.poll() is None:
            etl.kill()
    assert etl.returncode == 0, stderr[-3000:]
    assert "waiting for input table timezone1" in stderr
    assert_exactly_once(minio_lake, expected=1500)
    assert_time_is_when_pathway_processed_the_row(minio_lake)


def commit_times(lake: Lake, table: str, columns: list[str]) -> pl.DataFrame:
    """`columns` of every row the table gained, with its commit's timestamp in epoch ms."""
    dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
    rows = pl.from_arrow(pa.table(dt.load_cdf(starting_version=0, ending_version=dt.version())))
    assert isinstance(rows, pl.DataFrame)
    return rows.select(*columns, committed=pl.col("_commit_timestamp").dt.epoch("ms"))


def assert_time_is_when_pathway_processed_the_row(lake: Lake) -> None:
    """A streaming ETL's `time` lies between the input commit that carried the row and
    the unified commit that holds it: Pathway cannot process a row before its input was
    committed, and the sink cannot commit it before it was processed."""
    inputs = pl.concat([commit_times(lake, t, ["message"]) for t in ("timezone1", "timezone2")])
    unified = commit_times(lake, "timezone_unified", ["message", "time"])
    rows = inputs.join(unified, on="message", suffix="_unified")
    assert rows.height == inputs.height
    # 1 ms of slack: Pathway's times are even milliseconds.
    early = rows.filter(pl.col("time") + 1 < pl.col("committed"))
    late = rows.filter(pl.col("time") > pl.col("committed_unified"))
    assert early.is_empty(), f"{early.height} rows stamped before their input commit: {early}"
    assert late.is_empty(), f"{late.height} rows stamped after their unified commit: {late}"


def test_pathway_worker_threads_deliver_every_message_once(
    minio_lake: Lake, tmp_path: Path
) -> None:
    """`deltabus etl --threads 2`: Pathway spreads the transform over two workers; the
    sink still gets every row once, with its true timestamp."""
    TimezoneProducer(
        minio_lake,
        ProducerConfig(rate=20000, count=20000, commit_interval=0.05, seed=3, run_id="threads"),
    ).run()
    etl = run_cli(
        ["--json", "etl", "--mode", "bounded", "--threads", "2"], lake_env(minio_lake), tmp_path
    )
    assert etl.returncode == 0, etl.stderr[-3000:]
    assert '"rows": 20000' in etl.stdout
    assert_timestamps_true(minio_lake, assert_exactly_once(minio_lake, expected=20000))
