"""`python -m tools.launch` submits runs the way the UI's Launch button does, on Dagster's
public APIs only: each run records the `deltabus` code location, goes through the instance's
run queue (served by a daemon already running, else by one the launcher starts and stops),
prints its log, and a failed run or a job that cannot be launched exits 1.
The successful path (`pipeline_job --then producer_run_job`) is in test_dagster_cli.py."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from deltabus.delta.lake import Lake
from tests.conftest import lake_env
from tools.progress import short

REPO = Path(__file__).resolve().parents[1]
# Modules of Dagster's packages whose name starts with "_" (`_core`, `_cli`, ...) are private.
PRIVATE = re.compile(r"^dagster\w*\._")
# Generated or installed trees: not the project's modules.
NOT_SOURCE = {"artifacts", "bench-out", "lake", "node_modules"}


def project_modules() -> list[Path]:
    return [
        path
        for path in sorted(REPO.rglob("*.py"))
        if not any(
            part.startswith(".") or part in NOT_SOURCE for part in path.relative_to(REPO).parts
        )
    ]


def private_dagster_references(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import of a private Dagster module in `source`, and of each
    string naming one (as an instance config's `module:` would)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        else:
            continue
        found += [(node.lineno, name) for name in names if PRIVATE.match(name)]
    return found


def test_no_project_module_uses_a_private_dagster_module():
    modules = project_modules()
    assert REPO / "tools" / "launch.py" in modules and len(modules) > 20
    found = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in modules
        for line, name in private_dagster_references(path.read_text())
    ]
    assert not found, "private Dagster modules used:\n" + "\n".join(found)


def test_the_scan_finds_private_imports_and_module_paths():
    # Spelled in pieces so that a text search of the repository for them stays empty.
    core, internal = "dagster" + "._core", "dagster_graphql" + "._internal"
    sample = (
        f"from {core}.execution.api import execute_run\n"
        f"import os, {internal}\n"
        f"CONFIG = {{'module': '{core}.run_coordinator'}}\n"
        "from dagster import job\n"
        "from ._core import x\n"
        f"NOTE = 'see {core}'\n"
    )
    assert [line for line, _ in private_dagster_references(sample)] == [1, 2, 3]


def launcher_processes(home: Path) -> list[int]:
    """Processes whose environment names this DAGSTER_HOME (the launcher's children)."""
    marker = f"DAGSTER_HOME={home}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def launch(home: Path, env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    home.mkdir()
    # The instance `make demo` uses: runs queued for the daemon, pools, run monitoring.
    (home / "dagster.yaml").write_text((REPO / "platform" / "dagster.yaml").read_text())
    env = {**env, "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tools.launch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_failed_run_exits_1_and_is_recorded_like_a_ui_launch(
    minio_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # No partition and an empty lake: the checks of timezone_unified fail the run.
    home = tmp_path / "dagster_home"
    job = launch(home, lake_env(minio_lake), tmp_path, "producer_run_job")
    assert job.returncode == 1, job.stderr[-4000:]
    failed = re.search(r"^producer_run_job run (\S+): FAILURE$", job.stderr, re.MULTILINE)
    assert failed, job.stderr[-4000:]
    # The run's log reaches the launcher's stderr, in the lines tools.progress reads.
    assert "unified_checks: FAILED" in [short(line) for line in job.stderr.splitlines()]
    assert 'Execution of run for "producer_run_job" failed' in job.stderr

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get() as instance:
        run = instance.get_run_by_id(failed[1])
        assert run is not None and run.status == DagsterRunStatus.FAILURE
        origin = run.remote_job_origin
        assert origin is not None, "the run records no code location (runs timeline misses it)"
        assert origin.location_name == "deltabus"
        assert origin.job_name == "producer_run_job"
        assert len(instance.get_run_records()) == 1

    # The webserver, the daemon and their code servers are gone.
    deadline = time.monotonic() + 60
    while launcher_processes(home) and time.monotonic() < deadline:
        time.sleep(1)
    assert not launcher_processes(home)


def test_a_running_daemon_serves_the_queue_and_no_second_one_starts(
    minio_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    home = tmp_path / "dagster_home"
    env = {**lake_env(minio_lake), "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO)}
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "platform" / "dagster.yaml").read_text())
    # The instance's storage first: two processes creating its sqlite schema at once collide.
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get():
        pass
    daemon_bin = str(Path(sys.executable).with_name("dagster-daemon"))
    log = (tmp_path / "daemon.log").open("w")
    daemon = subprocess.Popen(
        [daemon_bin, "run", "-w", str(REPO / "workspace.yaml")],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        live = [daemon_bin, "liveness-check"]
        while subprocess.run(live, env=env, capture_output=True).returncode != 0:
            assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the daemon sent no heartbeat"
            time.sleep(1)
        job = subprocess.run(
            [sys.executable, "-m", "tools.launch", "producer_run_job"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert job.returncode == 1, job.stderr[-4000:]
        assert "served by the Dagster daemon already running" in job.stderr, job.stderr[-4000:]
        # The running daemon launched the run: its log is in that daemon's output.
        assert 'Execution of run for "producer_run_job" failed' not in job.stderr
        assert (
            'Execution of run for "producer_run_job" failed'
            in (tmp_path / "daemon.log").read_text()
        )
        assert daemon.poll() is None
    finally:
        daemon.send_signal(signal.SIGINT)
        daemon.wait(timeout=60)
        log.close()


def test_an_unknown_job_exits_1_and_says_what_to_check(tmp_path: Path):
    job = launch(tmp_path / "dagster_home", dict(os.environ), tmp_path, "no_such_job")
    assert job.returncode == 1, job.stderr[-4000:]
    error = job.stderr.strip().splitlines()[-1]
    assert error.startswith("error: no_such_job was not launched: "), job.stderr[-4000:]
    assert "check the job name" in error
