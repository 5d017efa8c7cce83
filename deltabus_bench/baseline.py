"""The results page as one baseline: `python -m deltabus_bench.baseline DIR... --out FILE`.

Reads the `report.json` of every benchmark output folder given (searched recursively) and
writes one Markdown page of their runs. A baseline is one date, one commit and one CPU
model: reports that differ in any of them, or that lack them (written before reports
named their commit), are refused with exit status 2, naming each report's values.
`--long-runs DIR` adds the soaks saved there (NAME.json), each with its own date, commit and
CPU, and the reading of its goals (NAME.md) when there is one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltabus_bench.goals import goal_table, idle_figures
from deltabus_bench.soak_markdown import soak_section

ANCHORS_LINK = "../design/architecture.md#anchors-the-published-figures-deltabus-is-compared-with"


class BaselineError(ValueError):
    """The reports cannot form one baseline (none found, or mixed provenance)."""


@dataclass(frozen=True)
class Report:
    name: str  # the folder the report is in, relative to the folder given
    path: Path
    body: dict[str, Any]

    @property
    def day(self) -> str | None:
        date = self.body.get("date")
        return date.split()[0] if isinstance(date, str) else None


def natural_key(path: Path) -> list[list[int | str]]:
    """Sorts paths folder by folder, numbers in names by their value: idle, idle-5m,
    idle-30m."""
    return [
        [int(bit) if bit.isdigit() else bit for bit in re.split(r"(\d+)", part)]
        for part in path.parts
    ]


def find_reports(folders: list[Path]) -> list[Report]:
    """Every report.json under `folders`, in name order (numbers by value)."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("report.json"), key=natural_key):
            name = str(path.parent.relative_to(folder)) if path.parent != folder else folder.name
            found.append(Report(name, path, json.loads(path.read_text())))
    if not found:
        raise BaselineError(f"no report.json under {', '.join(map(str, folders))}")
    return found


def check_one_baseline(reports: list[Report]) -> tuple[str, str, str]:
    """(day, commit, cpu) shared by every report; BaselineError naming the odd ones out."""
    keys = {(r.day, r.body.get("commit"), r.body.get("cpu")) for r in reports}
    if len(keys) == 1:
        day, commit, cpu = next(iter(keys))
        if day and commit and cpu and not commit.endswith("+dirty"):
            return day, commit, cpu
    lines = [
        f"  {r.path}: date {r.day}, commit {r.body.get('commit')}, cpu {r.body.get('cpu')}"
        for r in reports
    ]
    raise BaselineError(
        "a baseline is one date, one clean commit and one CPU model; these reports are "
        "not:\n" + "\n".join(lines) + "\nrerun them together from a clean checkout "
        "(make baseline), or give only the folders of one run"
    )


def find_long_runs(folder: Path) -> list[Report]:
    """Every soak report (`windows.json` saved as NAME.json) in `folder`, in name order.
    Each must be complete and name its date, a clean commit and its CPU, since it stands
    beside the baseline with its own; BaselineError names the first that does not."""
    if not folder.is_dir():
        raise BaselineError(f"no folder {folder} for the long runs")
    found = []
    for path in sorted(folder.glob("*.json")):
        body = json.loads(path.read_text())
        commit = body.get("commit")
        if body.get("mode") != "soak in windows" or not body.get("complete"):
            raise BaselineError(f"{path} is not a finished soak's windows.json")
        if not (body.get("date") and commit and body.get("cpu")) or commit.endswith("+dirty"):
            raise BaselineError(
                f"{path} does not name its date, clean commit and CPU model (date "
                f"{body.get('date')}, commit {commit}, cpu {body.get('cpu')}): rerun it "
                "from a clean checkout"
            )
        found.append(Report(path.stem, path, body))
    return found


def long_runs_markdown(runs: list[Report]) -> list[str]:
    """The page's last section: each long run with its own date, commit and CPU, and
    the reading of its goals kept beside it (NAME.md: why a goal was missed), if any."""
    if not runs:
        return []
    out = [
        "",
        "## Long runs",
        "",
        "Runs too long for a baseline, each with its own date, commit and CPU; their",
        "`windows.json` is kept in `docs/benchmarks/long-runs/`. Their goals and",
        "what they mean: [method.md](method.md).",
    ]
    for run in runs:
        out += ["", *soak_section(run.body, run.name)]
        reading = run.path.with_suffix(".md")
        if reading.is_file():
            out += ["", "#### Reading", "", reading.read_text().strip()]
    return out


def _seconds(value: Any) -> str:
    return "—" if value is None else f"{value:.2f}"


def _run_row(run: dict[str, Any]) -> str:
    cost = run.get("cost") or {}
    cpu = cost.get("cpu_s_per_million_msgs_total")
    requests = cost.get("requests_per_million_msgs")
    cells = [
        run["backbone"],
        run.get("etl", "pathway"),
        f"{run['rate']:,}",
        _seconds(run.get("p50")),
        _seconds(run.get("p99")),
        run.get("verdict", ""),
        "—" if cpu is None else f"{cpu:.1f}",
        "—" if requests is None else f"{requests:,.0f}",
        f"{run.get('lost', 0):,}",
    ]
    return "| " + " | ".join(cells) + " |"


def _summary_rows(report: Report) -> list[str]:
    """One line per workload and backbone: the lowest rate's latency and the highest rate
    kept up with."""
    rows = []
    for backbone in dict.fromkeys(r.get("backbone") for r in report.body.get("runs", [])):
        runs = [r for r in report.body["runs"] if r.get("backbone") == backbone]
        lowest = min(runs, key=lambda r: r["rate"])
        highest = (report.body.get("highest_keeping_up_rate") or {}).get(backbone)
        store = (report.body.get("store") or {}).get("profile", "loopback")
        kept = "none" if highest is None else f"{highest:,}"
        if highest is not None and highest == max(r["rate"] for r in runs):
            kept += " (the highest tried)"
        rows.append(
            f"| {report.name} | {backbone} | {store} | {report.body.get('profile')} | "
            f"{lowest['rate']:,} | {_seconds(lowest.get('p50'))} / "
            f"{_seconds(lowest.get('p99'))} | {kept} |"
        )
    return rows


def _serving_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The serving stage of each run that had one, and its standalone bulk load."""
    served = [r for r in runs if r.get("serving")]
    if not served:
        return []
    lines = [
        "",
        "| sink | rate msg/s | unified commit → served p50 / p99 | sent → served p99 "
        "| verdict | not served | bulk load rows/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in served:
        s = run["serving"]
        backend = s.get("backend", "")
        stage = s.get(f"unified_commit_to_{backend}") or {}
        sent = s.get(f"sent_to_{backend}") or {}
        replay = s.get("replay") or {}
        bulk = replay.get("rows_per_s")
        lines.append(
            f"| {backend} | {run['rate']:,} | {_seconds(stage.get('p50'))} / "
            f"{_seconds(stage.get('p99'))} | {_seconds(sent.get('p99'))} | "
            f"{s.get('verdict', '')} | {s.get('not_served', 0):,} | "
            f"{'—' if bulk is None else f'{bulk:,}'} |"
        )
    return lines


def _idle_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The idle pipeline after each run that measured one (`idle-s`)."""
    lines = []
    for run in runs:
        idle = idle_figures(run)
        if idle is None:
            continue
        requests, first = idle.requests_per_s, idle.first_after_s
        lines += [
            "",
            f"Idle after the {run['rate']:,} msg/s run ({idle.seconds:g} s without "
            f"traffic): {idle.busy:.1f} % of one core in all "
            f"({', '.join(f'{k} {v}' for k, v in idle.cpu.items())}), "
            f"{'n/a' if requests is None else requests} requests/s; the first messages "
            f"after it: {'not seen within 30 s' if first is None else f'{first:.2f} s'}.",
        ]
    return lines


def baseline_markdown(reports: list[Report], long_runs: list[Report] | None = None) -> str:
    """The page: its provenance once, a summary row per workload, then per report its
    command, runs, serving stage and idle cost, then the `long_runs`."""
    day, commit, cpu = check_one_baseline(reports)
    out = [
        "# Benchmark results",
        "",
        f"One baseline: {day}, commit {commit}, {cpu}. Generated by `make baseline`",
        "(`python -m deltabus_bench.baseline`) from the runs' `report.json`; how the",
        "figures are taken and what each column means: [method.md](method.md); the",
        "studies behind the design decisions, each with its own date, commit and CPU:",
        "[archive.md](archive.md). Latency is end to end in seconds; CPU is CPU-seconds",
        "per million messages over every process; requests are the store's, per million",
        "messages.",
        "",
        "| workload | backbone | store | commits | lowest rate msg/s | p50 / p99 there "
        "| highest rate keeping up |",
        "|---|---|---|---|---|---|---|",
        *(row for report in reports for row in _summary_rows(report)),
    ]
    goals = goal_table([r.body for r in reports])
    if goals:
        out += [
            "",
            "## Goals",
            "",
            "Each goal beside the figure measured here; the published figures they answer",
            f"are the [anchors]({ANCHORS_LINK}); a missed goal links to its measured reason.",
            "",
            *goals,
        ]
    for report in reports:
        body = report.body
        store = body.get("store") or {}
        runs = body.get("runs", [])
        out += [
            "",
            f"## {report.name}",
            "",
            f"Commit interval {body.get('profile')}, store {store.get('profile', 'loopback')}"
            f" ({store.get('summary', '')}); {body.get('machine', '')}.",
            "",
            "```bash",
            body.get("command", ""),
            "```",
            "",
            "| backbone | ETL | rate msg/s | p50 | p99 | verdict | CPU-s / M msgs "
            "| requests / M msgs | lost |",
            "|---|---|---|---|---|---|---|---|---|",
            *(_run_row(run) for run in runs),
        ]
        highest = body.get("highest_keeping_up_rate") or {}
        if highest:
            listed = ", ".join(
                f"{name} {'none' if rate is None else f'{rate:,}'}"
                for name, rate in highest.items()
            )
            out += ["", f"Highest rate keeping up: {listed}."]
        out += _serving_lines(runs) + _idle_lines(runs)
    out += long_runs_markdown(long_runs or [])
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deltabus_bench.baseline",
        description="Write the results page from the report.json of benchmark output "
        "folders that share one date, one commit and one CPU model.",
    )
    parser.add_argument("folders", nargs="+", type=Path, help="benchmark output folders")
    parser.add_argument(
        "--long-runs",
        type=Path,
        metavar="DIR",
        help="a folder of soak reports (windows.json saved as NAME.json) to add, each with "
        "its own date, commit and CPU",
    )
    parser.add_argument("--out", type=Path, help="the page to write (default: stdout)")
    args = parser.parse_args(argv)
    try:
        long_runs = find_long_runs(args.long_runs) if args.long_runs else []
        page = baseline_markdown(find_reports(args.folders), long_runs)
    except (BaselineError, OSError, json.JSONDecodeError) as exc:
        print(f"baseline: error: {exc}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(page)
    else:
        args.out.write_text(page)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
