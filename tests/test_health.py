"""The health endpoint of `deltabus --health-port`: /healthz while the process runs,
/readyz 503 until the component is ready, then 200; a bad port is exit 2 with the fix.

Real `deltabus` processes on a real MinIO (and PostgreSQL for the serving sink); the probes
are plain HTTP GETs, as a kubelet sends them.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from deltabus.core.health import HealthServer, mark_ready
from deltabus.core.net import free_port
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli
from tests.pg_fixture import Postgres


def get(port: int, path: str) -> tuple[int | None, str]:
    """Status and body of GET http://127.0.0.1:port/path; (None, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return None, ""


def start(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "deltabus", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(
    port: int, path: str, status: int, process: subprocess.Popen[str], timeout: float = 90
) -> list[int | None]:
    """Poll until GET `path` answers `status`; returns every status seen on the way."""
    seen: list[int | None] = []
    deadline = time.monotonic() + timeout
    while True:
        answer, _ = get(port, path)
        seen.append(answer)
        if answer == status:
            return seen
        if process.poll() is not None:
            pytest.fail(f"the process exited ({process.returncode}): {process.stderr.read()}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"{path} never answered {status} in {timeout}s: {sorted(set(seen), key=str)}"
            )
        time.sleep(0.05)


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_sink_and_etl_report_ready_once_they_run(
    minio_lake: Lake, postgres: Postgres, tmp_path: Path
) -> None:
    env = {**lake_env(minio_lake), "DELTABUS_POSTGRES_DSN": postgres.dsn}
    sink_port, etl_port = free_port(), free_port()
    table = f"served_health_{sink_port}"
    # The sink follows timezone_unified, which does not exist yet: alive, not ready.
    sink = start(
        ["--health-port", str(sink_port), "serve", "postgres", "--follow", "--table", table],
        env,
        tmp_path,
    )
    etl = None
    try:
        wait_for(sink_port, "/healthz", 200, sink)
        assert get(sink_port, "/healthz") == (200, "ok\n")
        for _ in range(10):  # stays unready while it waits
            assert get(sink_port, "/readyz") == (503, "starting\n")
            time.sleep(0.1)
        assert get(sink_port, "/nothing-here")[0] == 404
        # The ETL (port from the environment) creates timezone_unified and runs.
        etl = start(
            ["etl", "--mode", "continuous"],
            {**env, "DELTABUS_HEALTH_PORT": str(etl_port)},
            tmp_path,
        )
        wait_for(etl_port, "/readyz", 200, etl)
        assert get(etl_port, "/healthz") == (200, "ok\n")
        assert get(etl_port, "/readyz") == (200, "ready\n")
        seen = wait_for(sink_port, "/readyz", 200, sink)
        assert 200 not in seen[:-1] and set(seen[:-1]) <= {503}
    finally:
        for process in (etl, sink):
            if process is not None:
                stop(process)
    # Gone with its process.
    assert get(sink_port, "/healthz") == (None, "")


def local_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    settings = Settings(storage="local", local_root=tmp_path / "lake", prefix="lake")
    return {**lake_env(Lake(settings)), **extra}


def test_producer_and_consumer_report_ready(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    created = run_cli(["streams", "create", "orders", "--schema", "id:int64"], env, tmp_path, 60)
    assert created.returncode == 0, created.stderr
    producer_port, consumer_port = free_port(), free_port()
    producer = start(
        ["--health-port", str(producer_port), "produce", "--rate", "100", "--duration", "600"],
        env,
        tmp_path,
    )
    consumer = start(
        ["--health-port", str(consumer_port), "consume", "--stream", "orders", "--group", "g"],
        env,
        tmp_path,
    )
    try:
        for port, process in ((producer_port, producer), (consumer_port, consumer)):
            wait_for(port, "/readyz", 200, process)
            assert get(port, "/healthz") == (200, "ok\n")
    finally:
        for process in (producer, consumer):
            stop(process)


@pytest.mark.parametrize("port", ["0", "70000", "two"])
def test_an_invalid_health_port_is_exit_2_naming_the_option(tmp_path: Path, port: str) -> None:
    result = run_cli(["--health-port", port, "check"], local_env(tmp_path), tmp_path, 60)
    assert result.returncode == 2, result.stderr
    assert "--health-port" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_invalid_health_port_variable_is_exit_2_naming_it(tmp_path: Path) -> None:
    env = local_env(tmp_path, DELTABUS_HEALTH_PORT="70000")
    result = run_cli(["check"], env, tmp_path, 60)
    assert result.returncode == 2, result.stderr
    assert "DELTABUS_HEALTH_PORT='70000'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_taken_health_port_is_exit_2_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(["--health-port", str(port), "check"], local_env(tmp_path), tmp_path, 60)
    assert result.returncode == 2, result.stderr
    assert f"cannot serve the health endpoint on 0.0.0.0:{port}" in result.stderr
    assert "--health-port" in result.stderr and "Traceback" not in result.stderr


def test_the_server_takes_more_routes() -> None:
    server = HealthServer(0, "127.0.0.1")
    try:
        server.add_route("/metrics", lambda: (200, "text/plain", b"up 1\n"))
        assert get(server.port, "/metrics") == (200, "up 1\n")
        assert get(server.port, "/healthz") == (200, "ok\n")
        mark_ready()  # process-wide: this test process has no other server
        assert get(server.port, "/readyz") == (200, "ready\n")
    finally:
        server.close()
