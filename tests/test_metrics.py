"""The Prometheus endpoint of `deltabus --metrics-port`: a running ETL and a consumer are
scraped, and their counters move and match the records written.

Real `deltabus` processes on the real MinIO; the scrapes are plain HTTP GETs, parsed with
prometheus-client's own parser.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deltabus.core.net import free_port
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli

pytestmark = pytest.mark.timeout(300)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples | None:
    """Every sample of GET /metrics, keyed by (name, labels); None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def wait_until(
    port: int, process: subprocess.Popen[str], done: Callable[[Samples], bool], timeout: float
) -> Samples:
    deadline = time.monotonic() + timeout
    last: Samples | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the process exited ({process.returncode}): {process.stderr.read()}")
        last = scrape(port)
        if last is not None and done(last):
            return last
        time.sleep(0.2)
    pytest.fail(f"the metrics never got there in {timeout}s; last scrape: {last}")


def start(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "deltabus", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out


def test_a_running_etl_counts_what_it_reads_and_writes(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    produced = run_cli(
        ["produce", "--rate", "1000", "--duration", "2", "--commit-interval-ms", "100"],
        env,
        tmp_path,
    )
    assert produced.returncode == 0, produced.stderr[-2000:]
    port = free_port()
    etl = start(["--metrics-port", str(port), "etl", "--mode", "continuous"], env, tmp_path)
    try:
        samples = wait_until(
            port,
            etl,
            lambda s: total(s, "deltabus_records_total", component="etl", direction="out") >= 2000,
            timeout=180,
        )
    finally:
        stop(etl)
    out = total(samples, "deltabus_records_total", component="etl", direction="out")
    assert out == 2000  # every message once, none twice
    read = total(samples, "deltabus_records_total", component="etl", direction="in")
    assert read == 2000  # both inputs, every row
    assert total(samples, "deltabus_commits_total", component="etl") >= 1
    commits = total(samples, "deltabus_commit_duration_seconds_count", component="etl")
    assert commits >= total(samples, "deltabus_commits_total", component="etl")
    assert total(samples, "deltabus_bytes_total", component="etl", direction="out") > 0


def test_a_lease_replica_shows_its_children_counts(minio_lake: Lake, tmp_path: Path) -> None:
    """`etl --lease` runs Pathway children; its /metrics sums what they wrote (component
    etl) beside its own (component etl-lease)."""
    env = lake_env(minio_lake)
    produced = run_cli(
        ["produce", "--rate", "1000", "--duration", "1", "--partitions", "2"], env, tmp_path
    )
    assert produced.returncode == 0, produced.stderr[-2000:]
    port = free_port()
    args = ["--metrics-port", str(port), "etl", "--mode", "continuous", "--lease"]
    replica = start([*args, "--lease-ttl-s", "3"], env, tmp_path)
    try:
        samples = wait_until(
            port,
            replica,
            lambda s: total(s, "deltabus_records_total", component="etl", direction="out") >= 1000,
            timeout=180,
        )
    finally:
        stop(replica)
    assert total(samples, "deltabus_records_total", component="etl", direction="out") == 1000
    assert total(samples, "deltabus_commits_total", component="etl") >= 2  # both partitions
    assert not total(samples, "deltabus_records_total", component="etl-lease")


def test_a_consumer_counts_its_records_latency_and_lag(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    created = run_cli(
        [
            "streams",
            "create",
            "orders",
            "--partitions",
            "2",
            "--key",
            "customer",
            "--schema",
            "order_id:int64!,customer:string",
        ],
        env,
        tmp_path,
    )
    assert created.returncode == 0, created.stderr
    lines = "".join(json.dumps({"order_id": i, "customer": f"c{i % 5}"}) + "\n" for i in range(300))
    sent = run_cli(
        ["produce", "--stream", "orders", "--producer-id", "m"], env, tmp_path, input=lines
    )
    assert sent.returncode == 0, sent.stderr
    port = free_port()
    consumer = start(
        ["--metrics-port", str(port), "consume", "--stream", "orders", "--group", "m1"],
        env,
        tmp_path,
    )
    try:
        samples = wait_until(
            port,
            consumer,
            lambda s: (
                total(s, "deltabus_records_total", component="consumer", direction="in") >= 300
                and total(s, "deltabus_consumer_lag_versions", group="m1") == 0
                and any(n == "deltabus_consumer_lag_versions" for n, _ in s)
            ),
            timeout=120,
        )
    finally:
        out = stop(consumer)
    assert total(samples, "deltabus_records_total", component="consumer", direction="in") == 300
    assert len(out.splitlines()) == 300
    latency = total(samples, "deltabus_end_to_end_latency_seconds_count", component="consumer")
    assert latency >= 2  # a batch per partition commit at least
    tables = {dict(ls)["table"] for n, ls in samples if n == "deltabus_consumer_lag_versions"}
    assert tables == {"orders-p0", "orders-p1"}


def test_a_metrics_port_that_cannot_be_used_exits_2(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    bad = run_cli(["--metrics-port", "70000", "check"], env, tmp_path)
    assert bad.returncode == 2 and "metrics-port" in bad.stderr
    env["DELTABUS_METRICS_PORT"] = "zero"
    named = run_cli(["check"], env, tmp_path)
    assert named.returncode == 2 and "DELTABUS_METRICS_PORT" in named.stderr


def test_the_grafana_dashboard_queries_only_metrics_deltabus_exports() -> None:
    """Every metric the dashboard's queries name is one deltabus.core.metrics defines."""
    import re

    from deltabus.core.metrics import REGISTRY

    dashboard = json.loads(
        (Path(__file__).parent.parent / "deploy/grafana/deltabus.json").read_text()
    )
    exported = {s.name for family in REGISTRY.collect() for s in family.samples} | {
        f"{family.name}{suffix}"
        for family in REGISTRY.collect()
        for suffix in ("_total", "_bucket", "_count", "_sum", "")
    }
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {m for q in queries for m in re.findall(r"\b(deltabus_[a-z_]+)", q)}
    assert named and named <= exported, sorted(named - exported)
    assert len(dashboard["panels"]) >= 8
