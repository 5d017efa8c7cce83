"""Launch a job of the `deltabus` code location as the UI does, and run it in this process.

    python -m assets.launch pipeline_job                        # the stream window
    python -m assets.launch pipeline_job --then producer_run_job  # what `make demo` runs
    python -m assets.launch pipeline_job -c run.yaml --then producer_run_job --then-config l.yaml

`dagster job execute -m definitions` runs a job from its Python module: the run records no
code location, so the UI's runs timeline and the job's page do not list it. `dagster job
launch` records one but only queues the run for the daemon. This creates the run from
workspace.yaml (location `deltabus`) exactly like a launch from the UI, then executes it
here, logging like `dagster job execute`. `--then JOB` runs a partitioned job next for the
producer run the first one wrote, the run the unified_commits_sensor would request.

Exits 1 when a run fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from dagster import AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus
from dagster._cli.job import _create_run
from dagster._cli.workspace.cli_target import (
    get_code_location_from_workspace,
    get_remote_job_from_remote_repo,
    get_remote_repository_from_code_location,
    get_workspace_from_cli_opts,
)
from dagster._core.execution.api import execute_run
from dagster._utils.hosted_user_process import recon_job_from_origin
from dagster.version import __version__ as dagster_version
from dagster_shared.cli import WorkspaceOpts

from deltabus.lake import UNIFIED_TABLE

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTITION_TAG = "dagster/partition"


def launch(
    instance: DagsterInstance,
    job_name: str,
    run_config: Mapping[str, Any] | None = None,
    partition: str | None = None,
) -> DagsterRun:
    """Create a run of `job_name` from the workspace (with its code-location origin) and
    execute it in this process; returns the finished run."""
    opts = WorkspaceOpts(workspace=[str(REPO_ROOT / "workspace.yaml")])
    tags = {PARTITION_TAG: partition} if partition else {}
    with get_workspace_from_cli_opts(
        instance, dagster_version, opts, allow_in_process=True
    ) as workspace:
        location = get_code_location_from_workspace(workspace, None)
        repo = get_remote_repository_from_code_location(location, None)
        remote_job = get_remote_job_from_remote_repo(repo, job_name)
        run = _create_run(
            instance=instance,
            code_location=location,
            remote_repo=repo,
            remote_job=remote_job,
            run_config=dict(run_config or {}),
            tags=tags,
            op_selection=None,
            run_id=None,
        )
    assert run.job_code_origin is not None
    execute_run(recon_job_from_origin(run.job_code_origin), run, instance)
    finished = instance.get_run_by_id(run.run_id)
    assert finished is not None
    return finished


def producer_run_of(instance: DagsterInstance, run: DagsterRun) -> str | None:
    """The producer run id a run's timezone_unified materialization recorded."""
    records = instance.fetch_materializations(AssetKey(UNIFIED_TABLE), limit=5).records
    for record in records:
        mat = record.asset_materialization
        if record.run_id == run.run_id and mat and "producer_run" in mat.metadata:
            return str(mat.metadata["producer_run"].value)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Launch a job of the deltabus code location (recorded like a launch from "
        "the UI) and run it here."
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
    with DagsterInstance.get() as instance:
        run = launch(instance, args.job, run_config)
        if run.status != DagsterRunStatus.SUCCESS:
            print(f"{args.job} run {run.run_id}: {run.status.value}", file=sys.stderr)
            return 1
        if args.then:
            producer_run = producer_run_of(instance, run)
            if producer_run is None:
                print(f"{args.job} wrote no producer run; {args.then} not run", file=sys.stderr)
                return 1
            follow = launch(instance, args.then, then_config, partition=producer_run)
            if follow.status != DagsterRunStatus.SUCCESS:
                print(f"{args.then} run {follow.run_id}: {follow.status.value}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    status = main()
    # DuckDB's bindings print pages of "leaked instance" notices at interpreter shutdown;
    # ending here keeps the run's log the last thing printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
