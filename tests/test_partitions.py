"""Partitioned streams: the layout record, the producer's spread, and N ETL processes that
split the partitions between them, exactly-once under a SIGKILL of one of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import obstore
import pytest

from deltabus.apps.timezones.layout import (
    LAYOUT_KEY,
    TimezoneLayout,
    ensure_layout,
    partition_of,
    read_layout,
)
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.apps.timezones.results import export_results
from deltabus.core.errors import ConfigError
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli
from tests.helpers import assert_exactly_once, etl_process, read_table, wait_for_file


def test_the_hash_partitioner_spreads_evenly_and_always_alike():
    index, hashed = np.arange(40_000), TimezoneLayout(4, "hash")
    parts = partition_of("run7", index, hashed, 1000)
    assert np.array_equal(parts, partition_of("run7", index, hashed, 1000))  # deterministic
    assert np.array_equal(parts, partition_of("run7", index, hashed, 7))  # windows play no part
    counts = np.bincount(parts, minlength=4)
    assert counts.min() > 9_500 and counts.max() < 10_500, counts
    assert not np.array_equal(parts, partition_of("run8", index, hashed, 1000))  # run in key
    assert (partition_of("run7", index, TimezoneLayout(1), 1000) == 0).all()


def test_the_sticky_partitioner_gives_each_window_to_one_partition_in_turn():
    index, four = np.arange(40_000), TimezoneLayout(4)
    parts = partition_of("run7", index, four, 1000)
    assert np.array_equal(parts, partition_of("run7", index, four, 1000))  # deterministic
    by_window = parts.reshape(40, 1000)
    assert (by_window == by_window[:, :1]).all()  # a window's messages share a partition
    first = by_window[:, 0]
    assert ((np.diff(first) % 4) == 1).all()  # the next window takes the next partition
    assert np.bincount(parts, minlength=4).tolist() == [10_000] * 4
    starts = {int(partition_of(f"run{i}", index[:1], four, 1000)[0]) for i in range(20)}
    assert len(starts) > 1  # runs start on different partitions
    # A window over MAX_CHUNK messages is cut into equal chunks that go on in turn.
    big = partition_of("run7", np.arange(2 * 200_000), four, 200_000)
    chunks = big.reshape(8, 50_000)
    assert (chunks == chunks[:, :1]).all()
    assert sorted(chunks[:4, 0].tolist()) == [0, 1, 2, 3]
    assert np.bincount(big, minlength=4).tolist() == [100_000] * 4


def test_layout_names_and_assignment():
    assert TimezoneLayout(1).input_tables == ["timezone1", "timezone2"]
    assert TimezoneLayout(1).unified_tables == ["timezone_unified"]
    four = TimezoneLayout(4)
    assert four.inputs_of(2) == ["timezone1-p2", "timezone2-p2"]
    assert four.unified_of(3) == "timezone_unified-p3"
    assert four.owned(0, 2) == [0, 2] and four.owned(1, 2) == [1, 3]
    assert sorted(four.owned(0, 3) + four.owned(1, 3) + four.owned(2, 3)) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="ETL processes must be 1..4"):
        four.owned(0, 5)
    with pytest.raises(ConfigError, match="partitions must be 1..64"):
        TimezoneLayout(0)


def test_the_layout_is_recorded_once_and_never_changed(lake: Lake):
    assert read_layout(lake).partitions == 1  # a new lake
    assert ensure_layout(lake, 3).partitions == 3
    assert read_layout(lake) == TimezoneLayout(3, "sticky")  # readers are not told: it is recorded
    assert ensure_layout(lake, None).partitions == 3
    with pytest.raises(ConfigError, match="has 3 partitions per stream, not 2"):
        ensure_layout(lake, 2)


def test_an_unpartitioned_lake_is_not_partitioned_in_place(lake: Lake):
    TimezoneProducer(lake, ProducerConfig(rate=5000, count=100, run_id="flat")).run()
    with pytest.raises(ConfigError, match="has 1 partition per stream, not 2"):
        TimezoneProducer(
            lake, ProducerConfig(rate=5000, count=100, run_id="p2", partitions=2)
        ).run()
    assert read_layout(lake).partitions == 1
    assert not lake.exists("timezone1-p0")


def test_a_lake_recorded_before_the_sticky_partitioner_keeps_hashing(lake: Lake):
    obstore.put(lake.object_store, LAYOUT_KEY, b'{"partitions": 2, "streams": ["timezone1"]}')
    assert read_layout(lake) == TimezoneLayout(2, "hash")
    report = TimezoneProducer(
        lake, ProducerConfig(rate=20_000, count=2000, run_id="old", partitions=2)
    ).run()
    assert report.messages == 2000
    for table in TimezoneLayout(2).input_tables:
        index = _numbers(read_table(lake, table))
        assert (partition_of("old", index, TimezoneLayout(2, "hash"), 1) == int(table[-1])).all()


def _numbers(frame) -> np.ndarray:
    return np.array([int(m.rsplit("-", 1)[1]) for m in frame["message"]], dtype=np.int64)


def test_the_producer_spreads_a_run_over_the_partitions(lake: Lake):
    # 20k msg/s in 50 ms windows: 1000 messages a window, one partition each, in turn.
    config = ProducerConfig(
        rate=20_000, count=8000, run_id="spread", partitions=4, commit_interval=0.05
    )
    report = TimezoneProducer(lake, config).run()
    assert report.partitions == 4 and sum(report.per_stream.values()) == 8000
    tables = TimezoneLayout(4).input_tables
    rows = {t: read_table(lake, t) for t in tables}
    assert sum(r.height for r in rows.values()) == 8000
    for table, frame in rows.items():  # each message is in its window's partition
        index = _numbers(frame)
        assert (partition_of("spread", index, TimezoneLayout(4), 1000) == int(table[-1])).all()
    for p in range(4):  # and each partition has two whole windows of the eight
        index = np.concatenate([_numbers(rows[t]) for t in TimezoneLayout(4).inputs_of(p)])
        assert len(index) == 2000 and len(np.unique(index // 1000)) == 2
    # Resuming the same run writes nothing twice, in any partition.
    again = TimezoneProducer(lake, config).run()
    assert again.messages == 0
    assert sum(read_table(lake, t).height for t in tables) == 8000


def test_a_partitioned_run_resumes_only_with_its_commit_window(lake: Lake):
    config = ProducerConfig(rate=20_000, count=4000, run_id="w", partitions=2)
    TimezoneProducer(lake, config).run()
    faster = ProducerConfig(rate=40_000, count=4000, run_id="w", partitions=2)
    with pytest.raises(ConfigError, match="with 2000 messages per commit window"):
        TimezoneProducer(lake, faster).run()
    assert sum(read_table(lake, t).height for t in TimezoneLayout(2).input_tables) == 4000


def test_two_etl_processes_split_the_partitions_exactly_once_under_sigkill(
    minio_lake: Lake, tmp_path: Path
):
    lake, env = minio_lake, lake_env(minio_lake)
    ensure_layout(lake, 4)

    def start(process: int) -> tuple[subprocess.Popen, Path]:
        ready = tmp_path / f"ready-{process}-{time.monotonic_ns()}"
        proc = etl_process(
            env,
            tmp_path,
            *("--mode", "continuous", "--processes", "2", "--process", str(process)),
            *("--commit-interval-ms", "100", "--ready-file", str(ready)),
        )
        wait_for_file(ready, proc)
        return proc, ready

    etls = [start(0)[0], start(1)[0]]
    producer = subprocess.Popen(
        [sys.executable, "-m", "deltabus", "produce", "--rate", "2000", "--duration", "4"]
        + ["--run-id", "split", "--commit-interval-ms", "100"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        etls[1].send_signal(signal.SIGKILL)  # process 1 dies mid-stream
        etls[1].wait(timeout=10)
        time.sleep(1.0)
        etls[1] = start(1)[0]  # and comes back: its partitions resume
        out, err = producer.communicate(timeout=120)
        assert producer.returncode == 0, err[-3000:]
        deadline = time.monotonic() + 90
        while True:
            rows = sum(
                read_table(lake, t).height
                for t in TimezoneLayout(4).unified_tables
                if lake.exists(t)
            )
            if rows >= 8000 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for proc in etls:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in etls:
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert_exactly_once(lake, expected=8000)
    # Each unified partition holds exactly the messages of its input partitions.
    for i in range(4):
        unified = set(read_table(lake, f"timezone_unified-p{i}")["message"])
        inputs = set().union(
            *(set(read_table(lake, t)["message"]) for t in TimezoneLayout(4).inputs_of(i))
        )
        assert unified == inputs and unified
    # Readers see every partition: the CSV export holds all 8000 rows.
    assert export_results(lake, tmp_path / "out.csv") == 8000


def test_partitions_that_got_only_the_closing_commit_are_finished_too(
    minio_lake: Lake, tmp_path: Path
):
    """Two windows over four partitions: two partitions get rows, two only the run's
    closing commit, which has none. The ETL must still take every partition's position
    to its last version and record the run as finished there, or the run never counts as
    finished and the lag never reaches 0."""
    from deltabus.apps.timezones.etl.positions import recorded_finished_runs, recorded_positions

    lake = minio_lake
    config = ProducerConfig(
        rate=20_000, count=2000, run_id="short", partitions=4, commit_interval=0.05
    )
    TimezoneProducer(lake, config).run()
    heights = [read_table(lake, t).height for t in TimezoneLayout(4).input_tables]
    assert heights.count(0) == 4  # two partitions hold no rows in either stream
    etl = run_cli(["etl", "--mode", "bounded"], lake_env(lake), tmp_path, timeout=180)
    assert etl.returncode == 0, etl.stderr[-3000:]
    assert_exactly_once(lake, expected=2000)
    for i in range(4):
        unified = lake.open(f"timezone_unified-p{i}")
        positions, _ = recorded_positions(unified, TimezoneLayout(4).inputs_of(i))
        finished = recorded_finished_runs(unified)
        for table in TimezoneLayout(4).inputs_of(i):
            assert positions[table] == lake.open(table).version(), (table, positions)
            assert "short" in finished.get(table, set()), (table, finished)
