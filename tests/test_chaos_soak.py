"""Chaos: a seeded run that SIGKILLs the ETL and the producer, restarts MinIO and starts a
second ETL, then counts independently (deltalake and Polars only) that no message was lost
or duplicated.

The suite's run is short (`DELTABUS_CHAOS_SECONDS`, default 35 s of faults); `make chaos`
runs a longer soak with other seeds. The test's timeout follows the length of the fault phase
(the suite's default pytest timeout would end a 10-minute soak before it counts), and its
result line (`pytest -s`) gives the faults injected and the counts.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_TABLE
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, minio_settings_for
from tests.test_exactly_once_under_faults import own_minio  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CHAOS_SECONDS = float(os.environ.get("DELTABUS_CHAOS_SECONDS", "35"))
SEED = int(os.environ.get("DELTABUS_CHAOS_SEED", "20261122"))
RATE = 1500
FAULTS = ("kill-etl", "kill-producer", "restart-minio", "second-etl")
# Limits of the phases after the faults: draining, stopping the ETLs, the final bounded ETL;
# and a margin for MinIO's start-up, the fault loop's last step and the count.
DRAIN_S = 60
STOP_S = 60
FINAL_ETL_S = 300
MARGIN_S = 300


def producer_finish_s(chaos_seconds: float) -> float:
    """How long the producer may take to finish after the faults: it may have lost up to the
    whole fault phase to them and sends at RATE, so up to that long again, plus 300 s."""
    return 300 + chaos_seconds


def soak_timeout_s(chaos_seconds: float) -> int:
    """The chaos test's timeout for `chaos_seconds` of faults: the fault phase, the limits of
    the phases after it, and the margin."""
    after = producer_finish_s(chaos_seconds) + DRAIN_S + STOP_S + FINAL_ETL_S
    return int(chaos_seconds + after + MARGIN_S)


TIMEOUT_S = soak_timeout_s(CHAOS_SECONDS)


@dataclass
class Fleet:
    """The processes of the run, each logging to its own file."""

    env: dict[str, str]
    cwd: Path
    count: int
    etls: list[subprocess.Popen] = field(default_factory=list)
    producer: subprocess.Popen | None = None
    logs: dict[int, Path] = field(default_factory=dict)
    fenced: int = 0
    n: int = 0

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        self.n += 1
        log = self.cwd / f"{self.n:03d}-{name}.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "deltabus", *args],
                env=self.env,
                cwd=self.cwd,
                stdout=fh,
                stderr=fh,
            )
        self.logs[proc.pid] = log
        return proc

    def start_etl(self) -> None:
        self.etls.append(self._spawn("etl", "etl", "--mode", "continuous"))

    def start_producer(self) -> None:
        self.producer = self._spawn(
            "producer",
            "produce",
            "--run-id",
            "chaos",
            "--count",
            str(self.count),
            "--rate",
            str(RATE),
            "--commit-interval-ms",
            "100",
        )

    def log(self, proc: subprocess.Popen) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def reap(self) -> None:
        """Forget ETLs that ended; one that ended on its own must have been fenced."""
        for proc in list(self.etls):
            code = proc.poll()
            if code is None:
                continue
            self.etls.remove(proc)
            if code == -signal.SIGKILL:
                continue
            text = self.log(proc)
            assert code == 2 and "Traceback" not in text, f"ETL exit {code}:\n{text[-3000:]}"
            if "cannot reach MinIO" in text:
                continue  # started while MinIO was down: refused, having written nothing
            assert "another ETL took over" in text, text[-3000:]
            self.fenced += 1

    def kill(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def independent_verdict(lake: Lake) -> dict[str, int]:
    """Input rows, messages found in the output, lost and duplicated messages, from the
    Delta tables alone."""

    def read(table: str, columns: list[str]) -> pl.DataFrame:
        dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
        return pl.from_arrow(dt.to_pyarrow_table(columns=columns))  # type: ignore[return-value]

    inputs = pl.concat([read(t, ["message"]) for t in INPUT_TABLES])
    net = read(UNIFIED_TABLE, ["message", "diff"]).group_by("message").agg(pl.col("diff").sum())
    joined = inputs.join(net, on="message", how="full", coalesce=True)
    return {
        "inputs": inputs.height,
        "input_duplicates": inputs.height - inputs["message"].n_unique(),
        "found": net.filter(pl.col("diff") > 0).height,
        "lost": joined.filter(pl.col("diff").fill_null(0) < 1).height,
        "duplicated": joined.filter(pl.col("diff") > 1).height,
        "unexpected": net.filter(~pl.col("message").is_in(inputs["message"].implode())).height,
    }


def test_the_soak_timeout_follows_its_fault_phase():
    """`make chaos` runs 600 s of faults: the test's own timeout, not the suite's 600 s,
    must govern it, with time left for what follows the faults."""
    marks = [m for m in getattr(test_chaos_exactly_once, "pytestmark", []) if m.name == "timeout"]
    assert [m.args for m in marks] == [(soak_timeout_s(CHAOS_SECONDS),)]
    for seconds in (20, 35, 600, 3600):
        assert soak_timeout_s(seconds) >= 2 * seconds + 600
    assert soak_timeout_s(600) - soak_timeout_s(35) >= 2 * (600 - 35)


@pytest.mark.timeout(TIMEOUT_S)
def test_chaos_exactly_once(own_minio: MinioServer, tmp_path: Path):  # noqa: F811
    rng = random.Random(SEED)
    lake = Lake(minio_settings_for(own_minio, "chaos"))
    lake.init_bucket()
    count = int(RATE * (CHAOS_SECONDS + 5))
    fleet = Fleet(lake_env(lake) | {"DELTABUS_RETRY_MAX_WAIT_S": "120"}, tmp_path, count)
    fleet.start_producer()
    fleet.start_etl()
    injected: Counter[str] = Counter()
    deadline = time.monotonic() + CHAOS_SECONDS
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1.5, 4.0))
        fleet.reap()
        if not fleet.etls:
            fleet.start_etl()
        action = rng.choice(FAULTS)
        if action == "kill-etl" and fleet.etls:
            fleet.kill(rng.choice(fleet.etls))
            injected[action] += 1
            fleet.reap()
            if not fleet.etls:
                fleet.start_etl()
        elif action == "kill-producer" and fleet.producer and fleet.producer.poll() is None:
            fleet.kill(fleet.producer)
            injected[action] += 1
            fleet.start_producer()  # same run id: resumes
        elif action == "restart-minio":
            own_minio.stop()
            injected[action] += 1
            time.sleep(rng.uniform(1.0, 4.0))
            own_minio.start()
        elif action == "second-etl":
            fleet.start_etl()
            injected[action] += 1
    # Let the producer finish (restarting it if a fault ended it), then drain.
    deadline = time.monotonic() + producer_finish_s(CHAOS_SECONDS)
    while True:
        assert fleet.producer is not None
        code = fleet.producer.wait(timeout=max(1.0, deadline - time.monotonic()))
        if code == 0:
            break
        if code != -signal.SIGKILL:
            # Restarted just before MinIO went down: refused at start, having written
            # nothing (as an ETL started then is, in `reap`).
            text = fleet.log(fleet.producer)
            assert code == 2 and "Traceback" not in text, f"producer exit {code}:\n{text[-3000:]}"
            assert "cannot reach MinIO" in text, text[-3000:]
        fleet.start_producer()
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        fleet.reap()
        if len(fleet.etls) <= 1:
            break
        time.sleep(0.5)
    assert len(fleet.etls) <= 1, "a fenced ETL did not stop"
    for proc in fleet.etls:
        proc.terminate()
        proc.wait(timeout=STOP_S)
    final = subprocess.run(
        [sys.executable, "-m", "deltabus", "etl", "--mode", "bounded"],
        env=fleet.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=FINAL_ETL_S,
    )
    assert final.returncode == 0, final.stderr[-3000:]
    verdict = independent_verdict(lake)
    faults = ", ".join(f"{name} {injected[name]}" for name in FAULTS)
    print(
        f"chaos result (seed {SEED}, {CHAOS_SECONDS:g} s of faults, timeout {TIMEOUT_S} s): "
        f"faults injected: {faults}; ETLs fenced by a second one: {fleet.fenced}; messages "
        f"expected {count}, written {verdict['inputs']}, found {verdict['found']}, lost "
        f"{verdict['lost']}, duplicated {verdict['duplicated']} (written twice "
        f"{verdict['input_duplicates']}, unexpected {verdict['unexpected']})"
    )
    assert verdict == {
        "inputs": count,
        "input_duplicates": 0,
        "found": count,
        "lost": 0,
        "duplicated": 0,
        "unexpected": 0,
    }
