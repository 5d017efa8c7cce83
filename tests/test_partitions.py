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
import pytest

from deltabus.errors import ConfigError
from deltabus.lake import Lake
from deltabus.partitions import Layout, ensure_layout, partition_of, read_layout
from deltabus.producer import Producer, ProducerConfig
from deltabus.results import export_results
from tests.conftest import lake_env
from tests.helpers import assert_exactly_once, etl_process, read_table, wait_for_file


def test_message_ids_spread_evenly_and_always_alike():
    index = np.arange(40_000)
    parts = partition_of("run7", index, 4)
    assert np.array_equal(parts, partition_of("run7", index, 4))  # deterministic
    counts = np.bincount(parts, minlength=4)
    assert counts.min() > 9_500 and counts.max() < 10_500, counts
    assert not np.array_equal(parts, partition_of("run8", index, 4))  # the run is in the key
    assert (partition_of("run7", index, 1) == 0).all()


def test_layout_names_and_assignment():
    assert Layout(1).input_tables == ["timezone1", "timezone2"]
    assert Layout(1).unified_tables == ["timezone_unified"]
    four = Layout(4)
    assert four.inputs_of(2) == ["timezone1-p2", "timezone2-p2"]
    assert four.unified_of(3) == "timezone_unified-p3"
    assert four.owned(0, 2) == [0, 2] and four.owned(1, 2) == [1, 3]
    assert sorted(four.owned(0, 3) + four.owned(1, 3) + four.owned(2, 3)) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="ETL processes must be 1..4"):
        four.owned(0, 5)
    with pytest.raises(ConfigError, match="partitions must be 1..64"):
        Layout(0)


def test_the_layout_is_recorded_once_and_never_changed(lake: Lake):
    assert read_layout(lake).partitions == 1  # a new lake
    assert ensure_layout(lake, 3).partitions == 3
    assert read_layout(lake).partitions == 3  # readers are not told: it is recorded
    assert ensure_layout(lake, None).partitions == 3
    with pytest.raises(ConfigError, match="has 3 partitions per stream, not 2"):
        ensure_layout(lake, 2)


def test_an_unpartitioned_lake_is_not_partitioned_in_place(lake: Lake):
    Producer(lake, ProducerConfig(rate=5000, count=100, run_id="flat")).run()
    with pytest.raises(ConfigError, match="has 1 partition per stream, not 2"):
        Producer(lake, ProducerConfig(rate=5000, count=100, run_id="p2", partitions=2)).run()
    assert read_layout(lake).partitions == 1
    assert not lake.exists("timezone1-p0")


def test_the_producer_spreads_a_run_over_the_partitions(lake: Lake):
    report = Producer(
        lake, ProducerConfig(rate=20_000, count=4000, run_id="spread", partitions=4)
    ).run()
    assert report.partitions == 4 and sum(report.per_stream.values()) == 4000
    tables = Layout(4).input_tables
    rows = {t: read_table(lake, t) for t in tables}
    assert sum(r.height for r in rows.values()) == 4000
    assert all(r.height > 300 for r in rows.values()), {t: r.height for t, r in rows.items()}
    for table, frame in rows.items():  # each message is in the partition of its id's hash
        index = np.array([int(m.rsplit("-", 1)[1]) for m in frame["message"]])
        assert (partition_of("spread", index, 4) == int(table[-1])).all()
    # Resuming the same run writes nothing twice, in any partition.
    again = Producer(
        lake, ProducerConfig(rate=20_000, count=4000, run_id="spread", partitions=4)
    ).run()
    assert again.messages == 0
    assert sum(read_table(lake, t).height for t in tables) == 4000


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
                read_table(lake, t).height for t in Layout(4).unified_tables if lake.exists(t)
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
        inputs = set().union(*(set(read_table(lake, t)["message"]) for t in Layout(4).inputs_of(i)))
        assert unified == inputs and unified
    # Readers see every partition: the CSV export holds all 8000 rows.
    assert export_results(lake, tmp_path / "out.csv") == 8000
