"""`deltabus bench --layouts`: compare the cost of partition layouts run by run.

Run one after another, layouts minutes apart differ by what the machine did meanwhile
(a shared VM drifts by 10-20 % within an hour), which is as large as the difference being
measured. So each round runs every layout once, in the opposite order to the round
before, and each layout's cost is compared with the first layout's of the same round;
the summary gives the mean of those per-round ratios and their spread."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from statistics import mean
from typing import Any

from deltabus.core.errors import ConfigError
from deltabus_bench.config import BenchConfig
from deltabus_bench.report import write_json
from deltabus_bench.results import RunSummary
from deltabus_bench.verdict import KEEPING_UP

Layout = tuple[int, int]  # (partitions per stream, ETL processes)

_LAYOUT = re.compile(r"^\s*(\d+)\s*[x,:/]\s*(\d+)\s*$")


def parse_layouts(text: str) -> tuple[Layout, ...]:
    """'1x1,4x2' -> ((1, 1), (4, 2)): partitions x ETL processes; the first is the base."""
    layouts: list[Layout] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _LAYOUT.match(part)
        if not m:
            raise ConfigError(
                f"--layouts: {part!r} is not PARTITIONSxPROCESSES",
                "e.g. --layouts 1x1,2x2,4x2 (the first layout is the base of the ratios)",
            )
        layout = (int(m.group(1)), int(m.group(2)))
        if layout in layouts:
            raise ConfigError(f"--layouts: {part} is given twice")
        layouts.append(layout)
    if len(layouts) < 2:
        raise ConfigError(
            "--layouts needs at least two layouts to compare", "e.g. --layouts 1x1,4x2"
        )
    return tuple(layouts)


def order(layouts: tuple[Layout, ...], round_no: int) -> tuple[Layout, ...]:
    """The layouts of round `round_no` (0-based): reversed every other round, so a drift
    of the machine over the session favours neither end of the list."""
    return layouts if round_no % 2 == 0 else layouts[::-1]


def run_dir(out: Path, round_no: int, layout: Layout) -> Path:
    return out / f"round{round_no + 1}-p{layout[0]}n{layout[1]}"


def compare(
    cfg: BenchConfig,
    layouts: tuple[Layout, ...],
    rounds: int,
    run_one: Callable[[BenchConfig], dict[str, Any]],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every layout `rounds` times, alternating; write layouts.json and layouts.md in
    cfg.out and return the summary (with "errors": those of every run)."""
    if rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {rounds}")
    for p, n in layouts:  # refuse a bad layout before the first run, not mid-way
        replace(cfg, partitions=p, etl_processes=n)
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    total = rounds * len(layouts)
    for r in range(rounds):
        for layout in order(layouts, r):
            step = len(results) + 1
            log(f"layouts: run {step}/{total}: round {r + 1}, {layout[0]}x{layout[1]}")
            out = run_dir(cfg.out, r, layout)
            report = run_one(replace(cfg, partitions=layout[0], etl_processes=layout[1], out=out))
            errors += [f"round {r + 1} {layout[0]}x{layout[1]}: {e}" for e in report["errors"]]
            results.append({"round": r + 1, "layout": layout, "out": str(out), **report})
    summary = summarise(layouts, results)
    summary["command"] = cfg.command
    summary["profile"] = cfg.profile
    summary["store"] = cfg.store
    write_json(cfg.out / "layouts.json", summary)
    (cfg.out / "layouts.md").write_text(markdown(summary))
    return summary | {"errors": errors}


def summarise(layouts: tuple[Layout, ...], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per layout and rate: cores per round, the ratio over the base layout of the same
    round, their mean and spread, the p99s and whether every run kept up."""
    base = layouts[0]
    runs: dict[tuple[Layout, int, int], RunSummary] = {}
    rates: list[int] = []
    for res in results:
        for run in map(RunSummary.model_validate, res["runs"]):
            runs[(res["layout"], run.rate, res["round"])] = run
            if run.rate not in rates:
                rates.append(run.rate)
    rounds = sorted({res["round"] for res in results})
    rows = []
    for rate in rates:
        for layout in layouts:
            mine = [runs.get((layout, rate, r)) for r in rounds]
            cores = [_cores(m) for m in mine]
            base_cores = [_cores(runs.get((base, rate, r))) for r in rounds]
            ratios = [
                c / b - 1 for c, b in zip(cores, base_cores, strict=True) if c is not None and b
            ]
            done = [m for m in mine if m is not None]
            rows.append(
                {
                    "layout": f"{layout[0]}x{layout[1]}",
                    "partitions": layout[0],
                    "etl_processes": layout[1],
                    "rate": rate,
                    "cores": cores,
                    "cores_mean": _mean([c for c in cores if c is not None]),
                    "over_base": None if layout == base else ratios,
                    "over_base_mean": None if layout == base else _mean(ratios),
                    "over_base_min": None if layout == base or not ratios else min(ratios),
                    "over_base_max": None if layout == base or not ratios else max(ratios),
                    "cpu_s_per_million_msgs": _component_means(done),
                    "p99": [m.p99 for m in done],
                    "lost": sum(m.lost for m in done),
                    "all_keeping_up": bool(done) and all(m.verdict == KEEPING_UP for m in done),
                }
            )
    machine = next((res["machine"] for res in results if res.get("machine")), "")
    return {
        "base": f"{base[0]}x{base[1]}",
        "rounds": len(rounds),
        "machine": machine,
        "order": [[f"{p}x{n}" for p, n in order(layouts, r - 1)] for r in rounds],
        "rows": rows,
    }


def markdown(summary: dict[str, Any]) -> str:
    """layouts.md: one line per layout and rate."""
    lines = [
        f"# Layouts compared: {summary['rounds']} rounds, base {summary['base']}",
        "",
        f"Profile {summary['profile']}; store {summary.get('store', 'loopback')}; "
        f"machine: {summary['machine']}. "
        "Each round ran every layout once, in the opposite order to the round before; a "
        "layout's cost is compared with the base's of the same round. Cores: CPU of every "
        "component together (1.0 = one core busy), which at one rate is the cost per "
        "message.",
        "",
        f"Command: `{summary['command']}`",
        "",
        "| rate | layout | cores per round | over base per round | mean over base "
        "| p99 per round (s) | lost | all keeping up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        per_round = ", ".join("—" if c is None else f"{c:.3f}" for c in row["cores"])
        if row["over_base"] is None:
            ratios, avg = "(base)", "—"
        else:
            ratios = ", ".join(f"{100 * x:+.0f} %" for x in row["over_base"])
            avg = "—" if row["over_base_mean"] is None else f"{100 * row['over_base_mean']:+.1f} %"
        p99 = ", ".join(f"{p:.2f}" for p in row["p99"] if p is not None)
        lines.append(
            f"| {row['rate']:,} | {row['layout']} | {per_round} | {ratios} | {avg} | {p99} "
            f"| {row['lost']} | {'yes' if row['all_keeping_up'] else 'no'} |"
        )
    lines += [
        "",
        "Each run's own report is in round<R>-p<P>n<N>/ (report.md, runs/, logs/).",
        "",
    ]
    return "\n".join(lines)


def _cores(run: RunSummary | None) -> float | None:
    """CPU of every component in cores, unrounded (cpu_cores_total has two decimals)."""
    if run is None:
        return None
    return sum(run.cost.cpu_pct_of_one_core.values()) / 100


def _mean(values: list[float]) -> float | None:
    """The mean of `values`, or None when there are none."""
    return mean(values) if values else None


def _component_means(runs: list[RunSummary]) -> dict[str, float]:
    """Mean CPU-s per million messages of each component over the runs that have it."""
    parts: dict[str, list[float]] = {}
    for run in runs:
        per_run: dict[str, float] = {}
        for name, value in run.cost.cpu_s_per_million_msgs.items():
            name = "producer" if name.startswith("producer") else name  # not its run id
            per_run[name] = per_run.get(name, 0.0) + value
        for name, value in per_run.items():
            parts.setdefault(name, []).append(value)
    return {name: round(mean(v), 2) for name, v in parts.items()}
