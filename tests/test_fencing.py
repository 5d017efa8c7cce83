"""Fencing: a second ETL on one lake never loses or duplicates a message.

Real MinIO, real ETL processes; the verdicts read the Delta tables back independently.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA, UNIFIED_TABLE
from deltabus.apps.timezones.etl.sink import DeltaSinkObserver, open_unified
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.bus.fence import EPOCH_APP_ID, FencedError, claim, current_epoch
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table
from tests.conftest import lake_env
from tests.helpers import (
    assert_exactly_once,
    batch_row,
    etl_process,
    read_unified,
    wait_for_file,
)
from tests.test_exactly_once_under_faults import produce_in_background


def test_a_newer_claim_fences_the_older_lease(lake: Lake):
    dt_a = ensure_table(lake, UNIFIED_TABLE, UNIFIED_SCHEMA)
    a = claim(dt_a, UNIFIED_TABLE, UNIFIED_SCHEMA, "continuous")
    a.check(dt_a)  # still the owner
    dt_b = lake.open(UNIFIED_TABLE)
    b = claim(dt_b, UNIFIED_TABLE, UNIFIED_SCHEMA, "bounded")
    assert b.epoch == a.epoch + 1
    assert current_epoch(lake.open(UNIFIED_TABLE)) == b.epoch
    dt_a.update_incremental()
    with pytest.raises(FencedError) as err:
        a.check(dt_a)
    assert f"epoch {b.epoch}" in str(err.value) and "bounded ETL" in str(err.value)
    # A claim writes no rows.
    assert read_unified(lake).height == 0


def test_a_fenced_sink_stops_and_writes_nothing(lake: Lake):
    """The old ETL's sink finds its slot taken by the claim: it stops, its batch unwritten."""
    output = open_unified(lake, UNIFIED_TABLE, ["timezone1", "timezone2"], "continuous")
    failures: list[BaseException] = []
    sink = DeltaSinkObserver(output, 0.01, on_failure=failures.append)
    claim(lake.open(UNIFIED_TABLE), UNIFIED_TABLE, UNIFIED_SCHEMA, "continuous")
    now = int(time.time() * 1000)
    sink.on_change(None, batch_row("timezone1", 0, ["m"]), now, True)  # type: ignore[arg-type]
    sink.on_time_end(now)
    deadline = time.monotonic() + 10
    while not failures and time.monotonic() < deadline:
        time.sleep(0.02)
    assert failures and isinstance(failures[0], FencedError)
    assert isinstance(sink.error, FencedError)
    sink.on_change(None, batch_row("timezone1", 1, ["late"]), now + 1, True)  # type: ignore[arg-type]
    sink.on_time_end(now + 1)  # dropped: the ETL is stopping
    sink.on_end()
    assert read_unified(lake).height == 0


def _ready(path: Path) -> dict:
    return json.loads(path.read_text())


def test_second_continuous_etl_fences_the_first_exactly_once(minio_lake: Lake, tmp_path: Path):
    env = lake_env(minio_lake)
    thread, reports = produce_in_background(
        minio_lake, rate=2000, count=24_000, commit_interval=0.05, run_id="twoetl"
    )
    ready_a, ready_b = tmp_path / "a", tmp_path / "b"
    first = etl_process(env, tmp_path, "--mode", "continuous", "--ready-file", str(ready_a))
    wait_for_file(ready_a, first)
    time.sleep(1.5)
    second = etl_process(env, tmp_path, "--mode", "continuous", "--ready-file", str(ready_b))
    wait_for_file(ready_b, second)
    assert _ready(ready_b)["epoch"] == _ready(ready_a)["epoch"] + 1
    # The first stops on its own at its next commit: exit 2, one clear line, no traceback.
    _, err_a = first.communicate(timeout=30)
    assert first.returncode == 2, err_a[-3000:]
    assert "another ETL took over timezone_unified" in err_a
    assert f"pid {second.pid}" in err_a
    assert "Traceback" not in err_a
    thread.join(timeout=60)
    assert reports and reports[0].messages == 24_000
    deadline = time.monotonic() + 60
    while read_unified(minio_lake).height < 24_000 and time.monotonic() < deadline:
        time.sleep(0.5)
    second.terminate()
    _, err_b = second.communicate(timeout=30)
    assert second.returncode == 0, err_b[-3000:]
    assert_exactly_once(minio_lake, expected=24_000)


def test_bounded_etl_started_beside_a_continuous_one(minio_lake: Lake, tmp_path: Path):
    env = lake_env(minio_lake)
    thread, reports = produce_in_background(
        minio_lake, rate=2000, count=16_000, commit_interval=0.05, run_id="mixed"
    )
    ready = tmp_path / "ready"
    continuous = etl_process(env, tmp_path, "--mode", "continuous", "--ready-file", str(ready))
    wait_for_file(ready, continuous)
    time.sleep(1.0)
    bounded = etl_process(env, tmp_path, "--mode", "bounded")
    _, err_c = continuous.communicate(timeout=60)
    assert continuous.returncode == 2 and "another ETL took over" in err_c, err_c[-3000:]
    _, err_b = bounded.communicate(timeout=120)
    assert bounded.returncode == 0, err_b[-3000:]
    thread.join(timeout=60)
    assert reports and reports[0].messages == 16_000
    assert_exactly_once(minio_lake, expected=16_000)
    dt = minio_lake.open(UNIFIED_TABLE)
    assert dt.transaction_version(EPOCH_APP_ID) == 2


@pytest.fixture
def full_unified_dir(local_lake: Lake):
    """A 2 MB tmpfs mounted where the unified table lives, so it can really fill up."""
    target = Path(local_lake.uri(UNIFIED_TABLE))
    target.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(target)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


def test_a_dead_sink_ends_an_idle_etl(local_lake: Lake, full_unified_dir: Path, tmp_path: Path):
    """The unified table's disk fills: the ETL exits promptly, though no more data arrives."""
    env = {**lake_env(local_lake), "DELTABUS_RETRY_MAX_WAIT_S": "2"}
    ready = tmp_path / "ready"
    etl = etl_process(env, tmp_path, "--mode", "continuous", "--ready-file", str(ready))
    wait_for_file(ready, etl)
    TimezoneProducer(local_lake, ProducerConfig(rate=1000, count=200, run_id="before")).run()
    deadline = time.monotonic() + 30
    while read_unified(local_lake).height < 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert read_unified(local_lake).height == 200
    (full_unified_dir / "filler").write_bytes(b"x" * (2 * 1024 * 1024 - 64 * 1024))
    with contextlib.suppress(OSError):  # fill the last blocks
        (full_unified_dir / "filler2").write_bytes(b"x" * (256 * 1024))
    TimezoneProducer(local_lake, ProducerConfig(rate=1000, count=2000, run_id="after")).run()
    started = time.monotonic()
    try:
        _, err = etl.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        etl.kill()
        pytest.fail("the ETL kept running with a dead sink")
    assert etl.returncode == 2, err[-3000:]
    assert "no space left on the lake storage" in err, err[-3000:]
    assert time.monotonic() - started < 30
    assert "Traceback" not in err, err[-3000:]
