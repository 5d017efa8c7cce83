"""The benchmark (`deltabus bench`) as an asset: a subprocess whose report.json becomes metadata."""

import base64
import json
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from assets.common import BENCHMARK_GROUP, MEASURED_POOL, markdown_table
from deltabus.core.paths import REPO_ROOT
from deltabus.core.processes import child_env
from resources.lake import LakeResource

STATS = ["p50", "p75", "p85", "p95", "p99", "p99.9", "max"]
MAX_EMBEDDED_PLOT_BYTES = 400_000


class BenchConfig(Config):
    """Small defaults; the nightly schedule and `make bench` use longer runs."""

    rates: str = Field(default="10000", description="Comma-separated message rates (msg/s).")
    duration_s: float = Field(default=20, description="Seconds per rate.")
    warmup_s: float = Field(default=5, description="Seconds ignored at the start of each run.")
    profile: str = Field(default="100ms", description="Commit-interval profile: 100ms or 1000ms.")
    out_dir: str = Field(
        default="artifacts/bench", description="Reports go to a timestamped folder in here."
    )
    timeout_s: float = Field(default=3600, description="Give up after this many seconds.")


def bench_command(config: BenchConfig, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "deltabus",
        "bench",
        "--rates",
        config.rates,
        "--duration",
        f"{config.duration_s:g}",
        "--warmup",
        f"{config.warmup_s:g}",
        "--profile",
        config.profile,
        "--out",
        str(out),
    ]


@asset(
    group_name=BENCHMARK_GROUP,
    kinds={"python", "duckdb"},
    pool=MEASURED_POOL,  # never beside a stream window (platform/dagster.yaml)
    check_specs=[
        AssetCheckSpec(
            "bench_passed",
            asset="benchmark_report",
            description="The benchmark lost no message and its own checks passed (exit 0).",
        )
    ],
    description="Latency benchmark of the whole flow (producer, Pathway ETL, consumer) per rate: "
    "percentiles, achieved rate, whether it fell behind, and its plots.",
)
def benchmark_report(
    context: AssetExecutionContext, config: BenchConfig, lake: LakeResource
) -> MaterializeResult:
    out = (Path(config.out_dir) / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = bench_command(config, out)
    context.log.info(f"benchmark on {lake.describe()}: {' '.join(command[1:])}")
    env = child_env(lake.settings())
    tail: deque[str] = deque(maxlen=40)
    proc = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    assert proc.stderr is not None
    for line in proc.stderr:  # the benchmark logs to stderr: relay it to the run's log
        line = line.rstrip()
        tail.append(line)
        context.log.info(line)
        if time.monotonic() - started > config.timeout_s:
            proc.kill()
            break
    code = proc.wait()
    report_path = out / "report.json"
    if not report_path.exists():  # no report at all: nothing to materialize
        hint = (
            "this deltabus has no `bench` command yet"
            if any("No such command" in t for t in tail)
            else "see the log lines above"
        )
        raise Failure(
            f"the benchmark exited with status {code} ({hint})",
            metadata={"log_tail": MetadataValue.md("```\n" + "\n".join(tail) + "\n```")},
        )
    report = json.loads(report_path.read_text())
    runs = report.get("runs", [])
    rows = [
        {
            "rate": r.get("rate"),
            "samples": r.get("samples"),
            **{s: r.get(s) for s in STATS},
            "achieved_rate": r.get("achieved_rate"),
            "max_lag_s": r.get("max_lag_s"),
            "verdict": r.get("verdict"),
        }
        for r in runs
    ]
    plots = []
    for png in sorted(out.glob("*.png")):
        data = png.read_bytes()
        if len(data) <= MAX_EMBEDDED_PLOT_BYTES:
            plots.append(
                f"**{png.name}**\n\n![{png.stem}](data:image/png;base64,{base64.b64encode(data).decode()})"
            )
    metadata: dict[str, object] = {
        "profile": str(report.get("profile", config.profile)),
        "machine": str(report.get("machine", "")),
        "results": MetadataValue.md(
            "Latency in seconds.\n\n"
            + markdown_table(
                rows, ["rate", "samples", *STATS, "achieved_rate", "max_lag_s", "verdict"]
            )
        ),
        "report": MetadataValue.path(str(report_path)),
        "not_keeping_up_at": ", ".join(
            f"{r['rate']} ({r['verdict']})" for r in rows if r["verdict"] != "keeping up"
        )
        or "none",
        "highest_keeping_up_rate": str(report.get("highest_keeping_up_rate", {})),
    }
    stages = [
        {"rate": r.get("rate"), "stage": name, "p50": v.get("p50"), "p99": v.get("p99")}
        for r in runs
        for name, v in (r.get("stages") or {}).items()
        if isinstance(v, dict)
    ]
    if stages:
        metadata["stages"] = MetadataValue.md(
            "Where the time goes (seconds per stage).\n\n" + markdown_table(stages)
        )
    for r in runs:
        if r.get("p99") is not None:
            metadata[f"p99_at_{r.get('rate')}"] = float(r["p99"])
    if plots:
        metadata["plots"] = MetadataValue.md("\n\n".join(plots))
    lost = sum(int(r.get("lost") or 0) for r in runs)
    return MaterializeResult(
        metadata=metadata,
        check_results=[
            AssetCheckResult(
                check_name="bench_passed",
                passed=code == 0,
                description=None
                if code == 0
                else f"the benchmark exited with status {code} ({lost} messages lost); "
                "see its log lines and report.md",
                metadata={"exit_code": code, "lost_messages": lost},
            )
        ],
    )
