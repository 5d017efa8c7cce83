"""Distributed MinIO: 4 server processes on loopback, 2 drives each, one erasure set of 8
drives at EC:4 (write quorum 5, read quorum 4).

A node SIGKILLed mid-stream and restarted a few seconds later costs nothing: 0 lost,
0 duplicated. Clients use node 1's endpoint, which is never killed (a real deployment
puts a load balancer in front of the nodes).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus.adapters.dev.cluster import PID_FILE
from deltabus.adapters.dev.minio_process import MinioCluster, MinioServer, build_minio, find_minio
from deltabus.core.net import restartable_port
from deltabus.core.processes import LAKE_ENV_PREFIXES, process_alive
from deltabus.delta.lake import Lake
from tests.conftest import IN_CI, TEST_BUCKET, lake_env, minio_settings_for, run_cli
from tests.helpers import assert_exactly_once, dev_minio_cli, etl_process, wait_for_file

pytestmark = [pytest.mark.integration]

KILLED = 2  # the node the fault test kills (0-based); node 0 serves the clients


def minio_binary() -> Path:
    """The MinIO binary, built if Go is there; in CI a missing MinIO is a failure."""
    binary = find_minio()
    if binary is None:
        if shutil.which("go"):
            return build_minio()
        if IN_CI:
            pytest.fail("MinIO is required in CI: run `make minio-bin` (go install) first")
        pytest.skip("no MinIO binary and no Go to build one (set DELTABUS_MINIO_BIN)")
    return binary


@pytest.fixture(scope="module")
def minio_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioCluster]:
    """A distributed MinIO of 4 nodes x 2 drives for this module, with the test bucket."""
    cluster = MinioCluster(
        tmp_path_factory.mktemp("minio-cluster"),
        access_key="dist-" + secrets.token_hex(4),
        secret_key=secrets.token_urlsafe(18),
        binary=minio_binary(),
    )
    cluster.start()
    try:
        Lake(minio_settings_for(cluster, "bootstrap")).init_bucket()  # type: ignore[arg-type]
        await_all_drives(cluster)
        yield cluster
    finally:
        cluster.stop()


def cluster_lake(cluster: MinioCluster) -> Lake:
    return Lake(minio_settings_for(cluster, f"d-{uuid.uuid4().hex[:10]}"))  # type: ignore[arg-type]


def restore(cluster: MinioCluster) -> None:
    """Restart every node a test left stopped, so the next test gets the whole cluster."""
    for node, proc in enumerate(cluster.processes):
        if proc is None:
            cluster.restart_node(node)


def drives_holding(cluster: MinioCluster, key: str) -> dict[int, int]:
    """Per node, how many of its drives hold a part of `key` (its xl.meta)."""
    return {
        node: sum((d / TEST_BUCKET / key / "xl.meta").is_file() for d in cluster.drive_dirs(node))
        for node in range(cluster.nodes)
    }


def await_all_drives(cluster: MinioCluster, timeout: float = 60) -> None:
    """Wait until every node sees a healthy cluster and a new object lands on all 8
    drives: quorum is reached before the last node's drives have joined, and on a busy
    machine that can take seconds after start."""
    for node in range(cluster.nodes):
        cluster.await_health(200, 200, timeout=timeout, node=node)
    s3 = cluster_lake(cluster).s3_client()
    deadline = time.monotonic() + timeout
    while True:
        key = f"warmup-{uuid.uuid4().hex[:8]}"
        s3.put_object(Bucket=TEST_BUCKET, Key=key, Body=b"w" * 50_000)
        holding = drives_holding(cluster, key)
        if holding == dict.fromkeys(range(cluster.nodes), 2):
            return
        assert time.monotonic() < deadline, f"not every drive joined: {holding}"
        time.sleep(0.5)


def test_cluster_is_distributed_and_survives_a_node(minio_cluster: MinioCluster) -> None:
    cluster = minio_cluster
    health = cluster.health()
    assert health == {"write_status": 200, "read_status": 200, "write_quorum": 5, "read_quorum": 4}
    s3 = cluster_lake(cluster).s3_client()
    key = f"probe-{uuid.uuid4().hex[:8]}"
    s3.put_object(Bucket=TEST_BUCKET, Key=f"{key}/before", Body=b"a" * 50_000)
    # Striped over all 8 drives of the 4 nodes, not stored on the node that took the PUT.
    assert drives_holding(cluster, f"{key}/before") == {0: 2, 1: 2, 2: 2, 3: 2}
    try:
        cluster.kill_node(KILLED)
        cluster.await_health(write_status=200)  # 6 drives left >= write quorum 5
        body = s3.get_object(Bucket=TEST_BUCKET, Key=f"{key}/before")["Body"].read()
        assert body == b"a" * 50_000
        s3.put_object(Bucket=TEST_BUCKET, Key=f"{key}/during", Body=b"b" * 50_000)
        assert drives_holding(cluster, f"{key}/during") == {0: 2, 1: 2, 2: 0, 3: 2}
        cluster.kill_node(3)  # 4 drives left: enough to read, too few to write
        cluster.await_health(write_status=503, read_status=200)
        body = s3.get_object(Bucket=TEST_BUCKET, Key=f"{key}/during")["Body"].read()
        assert body == b"b" * 50_000
    finally:
        restore(cluster)
    cluster.await_health(write_status=200)


def files_written_since(cluster: MinioCluster, node: int, prefix: str, since: float) -> int:
    """How many object parts under `prefix` on `node`'s drives were written after `since`."""
    return sum(
        meta.stat().st_mtime >= since
        for drive in cluster.drive_dirs(node)
        for meta in (drive / TEST_BUCKET / prefix).rglob("xl.meta")
    )


def test_node_killed_mid_stream_loses_and_duplicates_nothing(
    minio_cluster: MinioCluster, tmp_path: Path
) -> None:
    cluster = minio_cluster
    lake = cluster_lake(cluster)
    count = 15_000
    env = lake_env(lake) | {"DELTABUS_RETRY_MAX_WAIT_S": "60"}
    ready = tmp_path / "ready"
    etl = etl_process(env, tmp_path, "--ready-file", str(ready))
    producer: subprocess.Popen[str] | None = None
    try:
        wait_for_file(ready, etl)
        producer = subprocess.Popen(
            [sys.executable, "-m", "deltabus", "produce", "--run-id", "dist"]
            + ["--count", str(count), "--rate", "1000", "--commit-interval-ms", "100"],
            env=env,
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not (
            lake.exists("timezone_unified") and lake.open("timezone_unified").version() >= 2
        ):
            assert time.monotonic() < deadline, "the ETL committed nothing"
            time.sleep(0.1)
        cluster.kill_node(KILLED)
        killed_at = lake.open("timezone_unified").version()
        time.sleep(random.Random(20261122).uniform(2.0, 4.0))
        restarted_at = lake.open("timezone_unified").version()
        assert restarted_at > killed_at, "no commit while the node was down"
        since = time.time()
        cluster.restart_node(KILLED)
        _, producer_log = producer.communicate(timeout=120)
        _, etl_log = etl.communicate(timeout=120)
    finally:
        for proc in (producer, etl):
            if proc is not None and proc.poll() is None:
                proc.kill()
        restore(cluster)
    assert producer.returncode == 0, producer_log[-3000:]
    assert etl.returncode == 0, etl_log[-3000:]
    final = lake.open("timezone_unified").version()
    assert final > restarted_at, "the stream ended before the node came back"
    unified = assert_exactly_once(lake, expected=count)
    assert unified.height == count
    # The node came back into the erasure set: it holds parts written after its restart.
    assert files_written_since(cluster, KILLED, lake.settings.prefix, since) > 0


def test_cli_minio_up_nodes_4_and_down(tmp_path: Path) -> None:
    minio_binary()
    base = restartable_port(span=4)
    env_file = tmp_path / "dev.env"
    env_file.write_text(
        f"DELTABUS_MINIO_ENDPOINT=http://127.0.0.1:{base}\n"
        "DELTABUS_ACCESS_KEY=dev-cluster\n"
        f"DELTABUS_SECRET_KEY={secrets.token_urlsafe(18)}\n"
        "DELTABUS_BUCKET=dev-cluster\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAKE_ENV_PREFIXES)}
    data_dir = tmp_path / "minio"
    up = ["--env-file", str(env_file), "minio", "up", "--nodes", "4", "--data-dir", str(data_dir)]
    down = ["minio", "down", "--data-dir", str(data_dir)]
    try:
        result = run_cli(up, env, tmp_path, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "distributed MinIO started: 4 nodes x 2 drives" in result.stdout
        assert "bucket 'dev-cluster' created" in result.stdout
        pids = [int(p) for p in (data_dir / PID_FILE).read_text().split()]
        assert len(pids) == 4 and all(process_alive(p, "minio") for p in pids)
        probe = MinioCluster(data_dir / "cluster", "-", "-", ports=[base + i for i in range(4)])
        deadline = time.monotonic() + 60
        for node in range(4):  # each node joins the cluster on its own: ask until it has
            while (health := probe.health(node))["write_quorum"] != 5:
                assert time.monotonic() < deadline, (node, health)
                time.sleep(0.5)
        again = run_cli(up, env, tmp_path, timeout=60)
        assert "already running" in again.stdout, again.stdout + again.stderr
        stopped = run_cli(down, env, tmp_path, timeout=60)
        assert stopped.returncode == 0 and "stopped distributed MinIO (4 nodes)" in stopped.stdout
        assert not any(process_alive(p, "minio") for p in pids)
        assert not (data_dir / PID_FILE).exists()
    finally:
        if (data_dir / PID_FILE).exists():
            run_cli(down, env, tmp_path, timeout=60)


def test_cli_refuses_two_or_three_nodes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAKE_ENV_PREFIXES)}
    for nodes in ("2", "3", "17"):
        result = run_cli(["minio", "up", "--nodes", nodes], env, tmp_path, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"--nodes {nodes}: use 1" in result.stderr
    result = run_cli(["minio", "up", "--nodes", "4", "--notify"], env, tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--notify works with a single MinIO server" in result.stderr
    assert not (tmp_path / ".env").exists() and not (tmp_path / ".deltabus").exists()


def test_cli_minio_up_single_node_writes_credentials_and_down(tmp_path: Path) -> None:
    """`deltabus minio up` without --nodes: one server, credentials written to the env file
    once (never printed), the bucket created; a remote endpoint is refused."""
    minio_binary()
    port = restartable_port()
    env_file, env, data_dir, up, down = dev_minio_cli(tmp_path, port, "dev-single")
    try:
        result = run_cli(up, env, tmp_path, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"wrote new credentials to {env_file}" in result.stdout
        assert "bucket 'dev-single' created" in result.stdout
        secret = next(
            line.split("=", 1)[1]
            for line in env_file.read_text().splitlines()
            if line.startswith("DELTABUS_SECRET_KEY=")
        )
        assert secret not in result.stdout + result.stderr
        again = run_cli(up, env, tmp_path, timeout=60)
        assert "already running" in again.stdout and "wrote new" not in again.stdout
    finally:
        stopped = run_cli(down, env, tmp_path, timeout=60)
    assert stopped.returncode == 0 and "stopped MinIO" in stopped.stdout
    env_file.write_text("DELTABUS_MINIO_ENDPOINT=http://minio.example:9000\n")
    remote = run_cli(up, env, tmp_path, timeout=60)
    assert remote.returncode == 2 and "is not a local http://127.0.0.1:PORT" in remote.stderr


def test_cli_minio_up_names_another_checkouts_minio_on_the_port(
    minio: MinioServer, tmp_path: Path
) -> None:
    """A MinIO this data directory did not start holds the endpoint, with other
    credentials: `up` stops with the store's rejection and says whose MinIO it may be and
    how to free the port, and leaves that MinIO running."""
    port = int(minio.endpoint.rsplit(":", 1)[1])
    env_file, env, data_dir, up, _ = dev_minio_cli(tmp_path, port, "dev-other")
    result = run_cli(up, env, tmp_path, timeout=60)
    assert result.returncode != 0
    assert "rejected the credentials" in result.stderr
    assert f"a MinIO not started from {data_dir} answers at" in result.stderr
    assert "run `deltabus minio down` there" in result.stderr
    assert not (data_dir / "minio.pid").exists()
    assert Lake(minio_settings_for(minio, "p")).exists("nothing") is False  # still serving
