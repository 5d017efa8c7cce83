"""The Dagster CLI from the repo root, as a user runs it: what `make demo` runs
(`python -m tools.launch pipeline_job --then producer_run_job`, then `python -m
tools.report`), `dagster job execute -m definitions` and `dagster asset materialize`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from deltabus.delta.lake import Lake
from tests.conftest import lake_env
from tests.helpers import assert_exactly_once
from tools.progress import short

REPO = Path(__file__).resolve().parents[1]
DAGSTER = [sys.executable, "-m", "dagster"]


def run(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess:
    # Run outside the repository: Dagster's CLI loads ./.env over the environment, and a
    # developer's .env (written by `deltabus minio up`) would point the run elsewhere.
    env = {**env, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_pipeline_job_from_the_cli_then_the_report(minio_lake: Lake, tmp_path: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **lake_env(minio_lake),
        "DAGSTER_HOME": str(home),
        "DELTABUS_SERVICE_DIR": str(tmp_path / "service"),
    }
    csv = tmp_path / "results.csv"
    config = tmp_path / "run.yaml"
    window = {
        "stream_window": {"config": {"rate": 1000, "duration_s": 2}},
        "results_csv": {"config": {"path": str(csv)}},
    }
    config.write_text(yaml.safe_dump({"ops": window}))
    latency_config = tmp_path / "latency.yaml"
    latency_config.write_text(
        yaml.safe_dump(
            {
                "ops": {
                    "latency_percentiles": {
                        "config": {"warmup_s": 0.5, "plot_dir": str(tmp_path / "plots")}
                    }
                }
            }
        )
    )
    launch = [sys.executable, "-m", "tools.launch", "pipeline_job", "-c", str(config)]
    then = ["--then", "producer_run_job", "--then-config", str(latency_config)]
    job = run([*launch, *then], env, tmp_path)
    assert job.returncode == 0, job.stderr[-4000:]
    assert 'Finished execution of run for "pipeline_job"' in job.stderr
    assert 'Finished execution of run for "producer_run_job"' in job.stderr
    assert "leaked" not in job.stderr  # the launcher ends before the bindings' noise
    # What `make demo` shows while the job runs: short progress lines from this log.
    progress = [line for line in map(short, job.stderr.splitlines()) if line]
    shown = "\n".join(progress) or job.stderr[:3000]
    assert "stream_window: started" in progress and "stream_window: done" in progress, shown
    assert any(line.startswith("stream_window: produced ") for line in progress), shown
    assert "latency_percentiles: done" in progress, shown
    assert "did not pass" not in job.stderr
    assert_exactly_once(minio_lake, expected=2000)
    assert csv.read_text().count("\n") == 2001
    secret = minio_lake.settings.secret_key.get_secret_value()
    assert secret not in job.stdout + job.stderr

    # Both runs were launched from the code location, as from the UI (its runs timeline
    # lists only such runs); the second is the producer run's partition.
    runs = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dagster import DagsterInstance\n"
            "for r in DagsterInstance.get().get_runs():\n"
            "    o = r.remote_job_origin\n"
            "    print(r.job_name, o and o.location_name, r.tags.get('dagster/partition'))",
        ],
        env={**env, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = sorted(runs.stdout.split("\n")[:2])
    assert len(lines) == 2 and lines[0].startswith("pipeline_job deltabus "), runs
    assert re.match(r"producer_run_job deltabus \S+$", lines[1]), runs

    report = run([sys.executable, "-m", "tools.report"], env, tmp_path, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr[-3000:]
    out = report.stdout
    assert "pipeline_job run" in out and "SUCCESS" in out
    assert re.search(r"producer_run_job run \S+ \(producer run \S+\): SUCCESS", out), out
    assert re.search(r"messages produced\s+2000\n", out), out
    assert re.search(r"unified rows\s+2000 ", out), out
    assert re.search(r"elapsed\s+\d+\.\d s", out), out
    # 2000 messages at 1000 msg/s less the 0.5 s warm-up (one more or less at the edge)
    assert re.search(r"\| end to end \(sent to unified commit\) \| 1(499|500|501) \|", out), out
    assert "timezone_unified.no_message_lost: passed" in out
    assert "latency_percentiles.p99_within_limit: passed" in out

    # The plain Dagster CLI runs the same job from the module (no latency: that is the
    # producer run's partition).
    plain = run(
        [*DAGSTER, "job", "execute", "-m", "definitions", "-j", "pipeline_job", "-c", str(config)],
        env,
        tmp_path,
    )
    assert plain.returncode == 0, plain.stderr[-4000:]
    assert_exactly_once(minio_lake, expected=4000)

    csv.unlink()
    only_csv = run(
        [
            *DAGSTER,
            "asset",
            "materialize",
            "-m",
            "definitions",
            "--select",
            "results_csv",
            "-c",
            str(config),
        ],
        env,
        tmp_path,
    )
    assert only_csv.returncode == 0, only_csv.stderr[-3000:]
    assert csv.read_text().count("\n") == 4001
