"""Fault injection against a real MinIO: every message exactly once, whatever happens.

Each test ends with DuckDB proving exactly-once over the real Delta tables.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltabus
from deltabus.adapters.dev.minio_process import MinioServer, find_minio
from deltabus.apps.timezones.contracts import INPUT_SCHEMA, PIPELINE_TABLES
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer, build_batches
from deltabus.core.net import restartable_port
from deltabus.delta.lake import Lake
from deltabus.delta.maintenance import maintain
from deltabus.delta.tables import TABLE_CONFIGURATION
from tests.conftest import IN_CI, lake_env, minio_settings_for, run_cli
from tests.helpers import etl_process, read_table, wait_for_file


def duckdb_exactly_once(lake: Lake) -> dict[str, int]:
    """DuckDB's verdict over the Delta tables: counts of input, unified, lost, duplicated."""
    con = duckdb.connect()
    inputs = pa.concat_tables(
        [
            DeltaTable(lake.uri(t), storage_options=lake.storage_options).to_pyarrow_table(
                columns=["message"]
            )
            for t in ("timezone1", "timezone2")
        ]
    )
    unified = DeltaTable(
        lake.uri("timezone_unified"), storage_options=lake.storage_options
    ).to_pyarrow_table(columns=["message", "diff"])
    con.register("inputs", inputs)
    con.register("unified", unified)
    row = con.execute(
        """SELECT (SELECT count(*) FROM inputs),
                  (SELECT count(*) FROM unified),
                  (SELECT count(*) FROM inputs WHERE message NOT IN (SELECT message FROM unified)),
                  (SELECT count(*) - count(DISTINCT message) FROM unified),
                  (SELECT count(*) - count(DISTINCT message) FROM inputs),
                  (SELECT count(*) FROM unified WHERE diff <> 1)"""
    ).fetchone()
    verdict = dict(
        zip(
            ("inputs", "unified", "lost", "duplicated", "input_duplicates", "retractions"),
            row,
            strict=False,
        )
    )
    print("exactly-once verdict:", verdict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0, verdict
    assert verdict["input_duplicates"] == 0 and verdict["retractions"] == 0, verdict
    assert verdict["inputs"] == verdict["unified"], verdict
    return verdict


def produce_in_background(lake: Lake, **config) -> tuple[threading.Thread, list]:
    reports: list = []

    def target() -> None:
        reports.append(TimezoneProducer(lake, ProducerConfig(**config)).run())

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, reports


@pytest.mark.parametrize("threads", [1, 2], ids=["1-worker", "2-workers"])
def test_etl_killed_at_random_points_restarts_exactly_once(
    minio_lake: Lake, tmp_path: Path, threads: int
):
    """SIGKILL at random points, three times, then a clean run: 0 lost, 0 duplicated.

    With two Pathway workers the rows of one input version can be split between workers;
    the positions committed with the output must still cover exactly what was written.
    """
    rng = random.Random(20261121 + threads)
    env = lake_env(minio_lake)
    thread, reports = produce_in_background(
        minio_lake, rate=3000, count=24_000, commit_interval=0.05, run_id="killetl"
    )
    kills, committed_before_final = 0, []
    for attempt in range(3):
        ready = tmp_path / f"ready-{attempt}"
        etl = etl_process(env, tmp_path, "--ready-file", str(ready), "--threads", str(threads))
        wait_for_file(ready, etl)
        time.sleep(rng.uniform(0.3, 2.0))
        etl.send_signal(signal.SIGKILL)
        etl.wait()
        kills += 1
        if minio_lake.exists("timezone_unified"):
            committed_before_final.append(read_table(minio_lake, "timezone_unified").height)
    thread.join(timeout=60)
    assert reports and reports[0].messages == 24_000
    final = etl_process(env, tmp_path, "--threads", str(threads))
    _, stderr = final.communicate(timeout=180)
    assert final.returncode == 0, stderr[-3000:]
    verdict = duckdb_exactly_once(minio_lake)
    assert verdict["unified"] == 24_000
    assert kills == 3
    # The kills really interrupted a stream that had committed output already.
    assert committed_before_final and max(committed_before_final) > 0


def test_producer_killed_and_restarted_writes_nothing_twice(minio_lake: Lake, tmp_path: Path):
    env = lake_env(minio_lake)
    args = [
        sys.executable,
        "-m",
        "deltabus",
        "--json",
        "produce",
        "--run-id",
        "crashy",
        "--count",
        "12000",
        "--rate",
        "3000",
        "--commit-interval-ms",
        "50",
    ]
    first = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (minio_lake.exists("timezone1") and minio_lake.open("timezone1").version() >= 10):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    partial = (
        read_table(minio_lake, "timezone1").height + read_table(minio_lake, "timezone2").height
    )
    assert 0 < partial < 12_000
    second = subprocess.run(
        args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr[-2000:]
    assert '"resumed_from": 0' not in second.stdout
    third = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and '"messages": 0' in third.stdout, third.stdout

    inputs = pl.concat([read_table(minio_lake, t) for t in ("timezone1", "timezone2")])
    expected = {f"crashy-{i}" for i in range(12_000)}
    assert inputs.height == 12_000, "a message was written twice or lost"
    assert set(inputs["message"]) == expected
    etl = run_cli(["etl"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-2000:]
    duckdb_exactly_once(minio_lake)


@pytest.fixture
def own_minio(tmp_path: Path):
    """A MinIO of this test's own, so stopping it disturbs no other test; on a port no
    client's source port can take while it is down."""
    binary = find_minio()
    if binary is None:
        if IN_CI:
            pytest.fail("MinIO is required in CI")
        pytest.skip("no MinIO binary")
    server = MinioServer(
        tmp_path / "own-minio", "outage-key", "outage-secret-1234", restartable_port(), binary
    )
    server.start()
    yield server
    server.stop()


def stream_through_an_etl(
    own_minio: MinioServer, tmp_path: Path, run_id: str, count: int, rate: int, *etl_args: str
) -> tuple[Lake, dict[str, str], subprocess.Popen[str], subprocess.Popen[str]]:
    """A producer and an ETL process on a lake of `own_minio` (retry budget 120 s), once
    the ETL has committed a few unified versions: the moment to take the storage away."""
    lake = Lake(minio_settings_for(own_minio, run_id))
    lake.init_bucket()
    env = lake_env(lake) | {"DELTABUS_RETRY_MAX_WAIT_S": "120"}
    producer = subprocess.Popen(
        [sys.executable, "-m", "deltabus", "produce", "--run-id", run_id]
        + ["--count", str(count), "--rate", str(rate), "--commit-interval-ms", "100"],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = tmp_path / "ready"
    etl = etl_process(env, tmp_path, *etl_args, "--ready-file", str(ready))
    try:
        wait_for_file(ready, etl)
        deadline = time.monotonic() + 60
        while not (
            lake.exists("timezone_unified") and lake.open("timezone_unified").version() >= 3
        ):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    except BaseException:
        producer.kill()
        etl.kill()
        raise
    return lake, env, producer, etl


def test_storage_outage_mid_stream(own_minio: MinioServer, tmp_path: Path):
    lake, _, producer, etl = stream_through_an_etl(own_minio, tmp_path, "outage", 16_000, 2000)
    try:
        own_minio.stop()
        time.sleep(10)
        own_minio.start()
        _, producer_log = producer.communicate(timeout=180)
        _, etl_log = etl.communicate(timeout=180)
    finally:
        for p in (producer, etl):
            if p.poll() is None:
                p.kill()
    assert producer.returncode == 0, producer_log[-3000:]
    assert etl.returncode == 0, etl_log[-3000:]
    assert "storage unavailable" in producer_log + etl_log
    verdict = duckdb_exactly_once(lake)
    assert verdict["unified"] == 16_000


def write_rows(lake: Lake, table: str, data: pa.Table, **kwargs) -> None:
    write_deltalake(
        lake.uri(table),
        data,
        mode="append",
        storage_options=lake.storage_options,
        configuration=TABLE_CONFIGURATION,
        **kwargs,
    )


def test_bad_input_goes_to_rejects_and_the_stream_goes_on(minio_lake: Lake, tmp_path: Path):
    lake = minio_lake
    good = build_batches("good", 1, int(time.time() * 1e6), 1000.0, 0, 400)["timezone1"].rows
    write_rows(lake, "timezone1", good)
    bad = pa.table(
        {
            "date": [
                "21/11/2026 10:00",
                None,
                "2026-11-21 10:00:00.000001 +0100",
                "2026-11-21T10:00:00Z",
            ],
            "message": ["bad-malformed", "bad-nulldate", None, "bad-iso"],
        },
        schema=INPUT_SCHEMA,
    )
    write_rows(lake, "timezone1", bad)
    extra = pa.table({"date": [good["date"][0].as_py()], "message": ["bad-extra"], "priority": [7]})
    write_rows(lake, "timezone1", extra, schema_mode="merge")
    # A foreign writer created timezone2 with the wrong type for `date`.
    write_rows(lake, "timezone2", pa.table({"date": [1, 2], "message": ["bad-int-1", "bad-int-2"]}))
    more = build_batches("late", 1, int(time.time() * 1e6), 1000.0, 0, 300)["timezone1"].rows
    write_rows(lake, "timezone1", more, schema_mode="merge")

    valid = good.num_rows + more.num_rows
    env = lake_env(lake)
    ready = tmp_path / "ready"
    etl = etl_process(env, tmp_path, "--mode", "continuous", "--ready-file", str(ready))
    try:
        wait_for_file(ready, etl)
        deadline = time.monotonic() + 60
        while True:
            done = (
                lake.exists("timezone_unified") and lake.open("timezone_unified").count() >= valid
            )
            if done and lake.exists("rejects") and lake.open("rejects").count() >= 7:
                break
            assert etl.poll() is None, etl.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "ETL did not process good and bad rows"
            time.sleep(0.1)
        assert etl.poll() is None, "a bad row stopped the ETL"
        etl.send_signal(signal.SIGTERM)
        _, stderr = etl.communicate(timeout=60)
    finally:
        if etl.poll() is None:
            etl.kill()
    assert etl.returncode == 0, stderr[-3000:]
    unified = read_table(lake, "timezone_unified")
    assert unified.height == valid and unified["message"].n_unique() == valid
    assert not unified["message"].str.starts_with("bad").any()
    rejects = read_table(lake, "rejects").sort("raw")
    reasons = {(r["source_table"], r["reason"]) for r in rejects.iter_rows(named=True)}
    assert reasons == {
        ("timezone1", "malformed date: expected %Y-%m-%d %H:%M:%S.%f %z"),
        ("timezone1", "null date"),
        ("timezone1", "null message"),
        ("timezone1", "unexpected column priority"),
        ("timezone2", "date has type Int64, expected string"),
    }
    assert rejects.height == 7
    assert all('"date"' in raw for raw in rejects["raw"])  # the raw row is kept whole
    # Rejects are a stream: a consumer group reads them as dead letters.
    with deltabus.Bus(lake).consumer("rejects", group="dead-letters") as reader:
        letters = []
        deadline = time.monotonic() + 30
        while len(letters) < 7:
            assert time.monotonic() < deadline, letters
            batch = reader.poll(0.5)
            if batch is not None:
                letters += batch.rows.column("raw").to_pylist()
    assert sorted(letters) == sorted(rejects["raw"].to_list())

    # A restart re-reads nothing twice: rejects and unified stay as they are.
    again = etl_process(env, tmp_path, "--mode", "continuous", "--ready-file", str(tmp_path / "r2"))
    wait_for_file(tmp_path / "r2", again)
    time.sleep(1.5)
    again.send_signal(signal.SIGTERM)
    again.communicate(timeout=60)
    assert read_table(lake, "rejects").height == 7
    assert read_table(lake, "timezone_unified").height == valid


def test_concurrent_producers_lose_no_commit(minio_lake: Lake, tmp_path: Path):
    env = lake_env(minio_lake)
    producers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deltabus",
                "--json",
                "produce",
                "--run-id",
                f"conc{i}",
                "--count",
                "3000",
                "--rate",
                "1500",
                "--commit-interval-ms",
                "20",
                "--seed",
                str(i),
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    for p in producers:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    inputs = pl.concat([read_table(minio_lake, t) for t in ("timezone1", "timezone2")])
    assert inputs.height == 9000 and inputs["message"].n_unique() == 9000
    etl = run_cli(["etl", "--producers", "3"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-2000:]
    duckdb_exactly_once(minio_lake)


def test_maintenance_during_the_stream(minio_lake: Lake, tmp_path: Path):
    lake = minio_lake
    env = lake_env(lake)
    ready = tmp_path / "ready"
    etl = etl_process(env, tmp_path, "--mode", "continuous", "--ready-file", str(ready))
    seen: list[str] = []
    stop_consumer = threading.Event()

    def consumer() -> None:
        """Tails the unified table's change feed, as any downstream reader would."""
        next_version = 0
        while not stop_consumer.is_set():
            if lake.exists("timezone_unified"):
                dt = lake.open("timezone_unified")
                latest = dt.version()
                if latest >= next_version:
                    rows = pa.table(
                        dt.load_cdf(starting_version=next_version, ending_version=latest).read_all()
                    )
                    seen.extend(rows.column("message").to_pylist())
                    next_version = latest + 1
            time.sleep(0.05)

    tail = threading.Thread(target=consumer, daemon=True)
    try:
        wait_for_file(ready, etl)
        tail.start()
        thread, reports = produce_in_background(
            lake, rate=2000, count=10_000, commit_interval=0.05, run_id="maint"
        )
        rounds = 0
        while thread.is_alive() or rounds < 2:
            maintain(lake, PIPELINE_TABLES, retention_hours=1)
            rounds += 1
            time.sleep(0.3)
        deadline = time.monotonic() + 60
        while not (
            lake.exists("timezone_unified") and lake.open("timezone_unified").count() >= 10_000
        ):
            assert etl.poll() is None, etl.communicate()[1][-3000:]
            assert time.monotonic() < deadline, read_table(lake, "timezone_unified").height
            time.sleep(0.1)
        maintain(lake, PIPELINE_TABLES, retention_hours=1)
        time.sleep(0.5)
    finally:
        stop_consumer.set()
        etl.send_signal(signal.SIGTERM)
        _, stderr = etl.communicate(timeout=60)
    assert etl.returncode == 0, stderr[-3000:]
    assert rounds >= 2
    history = lake.open("timezone1").history()
    assert any(h.get("operation") == "OPTIMIZE" for h in history), "no compaction ran"
    duckdb_exactly_once(lake)
    assert len(seen) == 10_000 and len(set(seen)) == 10_000, (
        "the consumer saw rows twice or lost some"
    )


def test_etl_stopped_during_an_outage_exits_promptly_and_loses_nothing(
    own_minio: MinioServer, tmp_path: Path
):
    """SIGTERM while storage is down: the ETL stops within seconds, not after its retry
    budget, says why, and the next run delivers every message exactly once."""
    lake, env, producer, etl = stream_through_an_etl(
        own_minio, tmp_path, "stop-outage", 6000, 1000, "--mode", "continuous"
    )
    try:
        own_minio.stop()
        time.sleep(1.5)  # the ETL is retrying now
        etl.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, etl_log = etl.communicate(timeout=60)
        took = time.monotonic() - sent
        own_minio.start()
        _, producer_log = producer.communicate(timeout=180)
    finally:
        for p in (producer, etl):
            if p.poll() is None:
                p.kill()
    assert took < 20, f"the ETL took {took:.1f}s to stop (retry budget 120s)"
    assert etl.returncode == 2, etl_log[-3000:]
    assert "stopped while the storage was unavailable" in etl_log, etl_log[-3000:]
    assert "Traceback" not in etl_log, etl_log[-3000:]
    assert producer.returncode == 0, producer_log[-3000:]
    rerun = run_cli(["etl"], env, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    verdict = duckdb_exactly_once(lake)
    assert verdict["unified"] == 6_000


def test_rejects_written_again_after_a_restart_are_kept_once(local_lake: Lake) -> None:
    """An ETL that dies after committing rejects but before the unified commit reads
    the same input versions again: their rejects are not kept twice."""
    from deltabus.apps.timezones.etl.rejects import RejectsWriter

    def bad(versions: list[int]) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "date": ["x"] * len(versions),
                "message": [f"bad-{v}" for v in versions],
                "raw": ["{}"] * len(versions),
                "source_version": versions,
                "reason": ["malformed date"] * len(versions),
            }
        )

    first = RejectsWriter(local_lake)
    assert first.write("timezone1", bad([3, 4])) == 2
    assert first.write("timezone2", bad([3])) == 1
    first.close()
    again = RejectsWriter(local_lake)  # a restarted ETL
    assert again.write("timezone1", bad([3, 4])) == 0
    assert again.write("timezone1", bad([4, 5])) == 1
    assert again.write("timezone2", bad([3, 4])) == 1
    again.close()
    kept = read_table(local_lake, "rejects")
    assert sorted(kept["message"].to_list()) == ["bad-3", "bad-3", "bad-4", "bad-4", "bad-5"]
