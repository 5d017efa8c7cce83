"""Launch a job of the `deltabus` code location as the UI does, and wait for it.

    python -m tools.launch pipeline_job                        # the stream window
    python -m tools.launch pipeline_job --then producer_run_job  # what `make demo` runs
    python -m tools.launch pipeline_job -c run.yaml --then producer_run_job --then-config l.yaml

Runs are submitted the way the UI's Launch button submits them: a `dagster-webserver` on
workspace.yaml (started here on a free loopback port) receives them through Dagster's GraphQL
client, so each run records the code location `deltabus` (the UI's runs timeline and the
job's page list only such runs) and goes through the instance's run queue, limits and pools.
The queue is served by the daemon of a `dagster dev` already running on the same DAGSTER_HOME,
else by a `dagster-daemon run` started here. That daemon's run worker prints the run's log to
this process's stderr in the format of `dagster job execute`, which `tools.progress` reads.
`--then JOB` runs a partitioned job next for the producer run the first one wrote, the run the
unified_commits_sensor would request. Everything started here is stopped before it returns.

Exits 1 when a run fails or cannot be launched, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from dagster import AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.core.net import free_port
from deltabus.core.paths import REPO_ROOT

WORKSPACE = REPO_ROOT / "workspace.yaml"
LOCATION = "deltabus"
# The repository Dagster makes of a code location's `Definitions`.
REPOSITORY = "__repository__"
PARTITION_TAG = "dagster/partition"
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
# Daemons heartbeat every 30 s: one silent for 30 s longer than that is taken as stopped.
HEARTBEAT_TOLERANCE_S = 30
WEBSERVER_START_S = 300
POLL_S = 0.5


class LaunchError(Exception):
    """A run could not be submitted or served; the message says how to fix it."""


def dagster_script(name: str) -> str:
    """The path of a console script of the Dagster install this interpreter runs."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise LaunchError(
            f"{name} is not installed next to {sys.executable} nor on PATH; install the "
            "project's packages (`make venv`) and run with .venv/bin/python"
        )
    return found


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Interrupt a process started here (as Ctrl-C would) and wait for it to exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class QueueDaemon:
    """Makes sure a Dagster daemon dequeues the runs in this instance's run queue.

    Relies on the daemon of a running `dagster dev` while its heartbeats are recent, else
    starts `dagster-daemon run` on workspace.yaml; `close` ends only a daemon started here.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.elsewhere = False
        self._check: subprocess.Popen | None = None
        self._checked_at = -float("inf")

    def _start_check(self) -> None:
        self._checked_at = time.monotonic()
        self._check = subprocess.Popen(
            [dagster_script("dagster-daemon"), "liveness-check"],
            env={**os.environ, "DAGSTER_DAEMON_HEARTBEAT_TOLERANCE": str(HEARTBEAT_TOLERANCE_S)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def poll(self) -> None:
        """Advance: start a liveness check when due, and a daemon when one found none.

        Raises LaunchError when the daemon started here has exited.
        """
        if self.proc is not None:
            code = self.proc.poll()
            if code is not None:
                raise LaunchError(
                    f"dagster-daemon exited with code {code} (its output is above); fix what "
                    "it reports, or start `dagster dev` on this DAGSTER_HOME and launch again"
                )
            return
        if self._check is None:
            # A daemon that stopped a moment ago still looks live: look again later.
            if time.monotonic() - self._checked_at >= HEARTBEAT_TOLERANCE_S:
                self._start_check()
            return
        code = self._check.poll()
        if code is None:
            return
        self._check = None
        self.elsewhere = code == 0
        if not self.elsewhere:
            self.proc = subprocess.Popen(
                [dagster_script("dagster-daemon"), "run", "-w", str(WORKSPACE)]
                + ["--log-level", "warning"]
            )

    def close(self) -> None:
        """Stop the daemon started here and wipe the heartbeats it left, so that the next
        launch does not take it for a running one."""
        if self._check is not None:
            stop(self._check)
        if self.proc is None:
            return
        stop(self.proc)
        self.proc = None
        subprocess.run(
            [dagster_script("dagster-daemon"), "wipe"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


@contextmanager
def webserver(daemon: QueueDaemon) -> Iterator[DagsterGraphQLClient]:
    """A `dagster-webserver` on workspace.yaml on a free loopback port, and a GraphQL
    client for it once it serves (the code location is loaded by then)."""
    port = free_port()
    proc = subprocess.Popen(
        [dagster_script("dagster-webserver"), "-w", str(WORKSPACE)]
        + ["-h", "127.0.0.1", "-p", str(port), "--log-level", "warning"]
        + ["--dagster-log-level", "warning", "--code-server-log-level", "warning"]
    )
    try:
        deadline = time.monotonic() + WEBSERVER_START_S
        while True:
            if proc.poll() is not None:
                raise LaunchError(
                    f"dagster-webserver exited with code {proc.returncode} (its output is "
                    "above); `dg check defs` shows why the "
                    "code location does not load"
                )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"dagster-webserver did not serve on port {port} within "
                    f"{WEBSERVER_START_S} s; is the machine overloaded?"
                )
            daemon.poll()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(POLL_S)
        yield DagsterGraphQLClient("127.0.0.1", port_number=port)
    finally:
        stop(proc)


def submit(
    client: DagsterGraphQLClient,
    job_name: str,
    run_config: Mapping[str, Any] | None = None,
    partition: str | None = None,
) -> str:
    """Submit a run of `job_name` of the `deltabus` location; returns its run id."""
    try:
        return client.submit_job_execution(
            job_name,
            repository_location_name=LOCATION,
            repository_name=REPOSITORY,
            run_config=dict(run_config or {}),
            tags={PARTITION_TAG: partition} if partition else None,
        )
    except DagsterGraphQLClientError as exc:
        raise LaunchError(
            f"{job_name} was not launched: {' '.join(map(str, exc.args))}; check the job name "
            "and the run config (the UI's launchpad shows the config a job takes)"
        ) from exc


def wait(instance: DagsterInstance, run_id: str, daemon: QueueDaemon) -> DagsterRun:
    """Poll the run until it finishes, keeping a daemon serving the queue meanwhile."""
    told = False
    while True:
        run = instance.get_run_by_id(run_id)
        if run is None:
            raise LaunchError(
                f"run {run_id} is not in the instance at DAGSTER_HOME="
                f"{os.environ.get('DAGSTER_HOME')}; the webserver recorded it elsewhere"
            )
        if run.status in FINISHED:
            return run
        daemon.poll()
        if daemon.elsewhere and not told:
            print(
                f"{run.job_name} run {run_id} is served by the Dagster daemon already running "
                "on this DAGSTER_HOME (dagster dev): its log is in that daemon's output and in "
                "the UI",
                file=sys.stderr,
            )
            told = True
        time.sleep(POLL_S)


def producer_run_of(instance: DagsterInstance, run: DagsterRun) -> str | None:
    """The producer run id a run's timezone_unified materialization recorded."""
    records = instance.fetch_materializations(AssetKey(UNIFIED_TABLE), limit=5).records
    for record in records:
        mat = record.asset_materialization
        if record.run_id == run.run_id and mat and "producer_run" in mat.metadata:
            return str(mat.metadata["producer_run"].value)
    return None


def run_jobs(
    instance: DagsterInstance,
    job: str,
    run_config: Mapping[str, Any],
    then: str | None = None,
    then_config: Mapping[str, Any] | None = None,
) -> int:
    """Launch `job`, then `then` for the producer run it wrote; 0 when every run succeeded,
    1 when one failed or could not be launched, 130 when interrupted."""
    daemon = QueueDaemon()
    try:
        with webserver(daemon) as client:
            run = wait(instance, submit(client, job, run_config), daemon)
            if run.status != DagsterRunStatus.SUCCESS:
                print(f"{job} run {run.run_id}: {run.status.value}", file=sys.stderr)
                return 1
            if then:
                producer_run = producer_run_of(instance, run)
                if producer_run is None:
                    print(f"{job} wrote no producer run; {then} not run", file=sys.stderr)
                    return 1
                run_id = submit(client, then, then_config, partition=producer_run)
                follow = wait(instance, run_id, daemon)
                if follow.status != DagsterRunStatus.SUCCESS:
                    print(f"{then} run {run_id}: {follow.status.value}", file=sys.stderr)
                    return 1
        return 0
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; stopping what was started here", file=sys.stderr)
        return 130
    finally:
        daemon.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Launch a job of the deltabus code location as the UI does (recorded with "
        "its code location, through the run queue) and wait for it."
    )
    parser.add_argument("job", help="job name, e.g. pipeline_job")
    parser.add_argument("-c", "--config", type=Path, help="run config YAML file")
    parser.add_argument(
        "--then",
        metavar="JOB",
        help="a partitioned job to run next for the producer run the first job wrote "
        "(e.g. producer_run_job: checks and latency of that run)",
    )
    parser.add_argument("--then-config", type=Path, help="run config YAML file of --then's job")
    args = parser.parse_args(argv)
    run_config = yaml.safe_load(args.config.read_text()) if args.config else {}
    then_config = yaml.safe_load(args.then_config.read_text()) if args.then_config else {}
    if not os.environ.get("DAGSTER_HOME"):
        print(
            "error: DAGSTER_HOME is not set, so the runs would not be kept; export "
            "DAGSTER_HOME=<an existing directory> (make demo uses .deltabus/dagster_home)",
            file=sys.stderr,
        )
        return 1
    with DagsterInstance.get() as instance:
        return run_jobs(instance, args.job, run_config, args.then, then_config)


if __name__ == "__main__":
    status = main()
    # DuckDB's bindings print pages of "leaked instance" notices at interpreter shutdown;
    # ending here keeps the run's log the last thing printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
