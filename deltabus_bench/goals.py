"""The benchmark's goals, judged on a baseline's reports: each figure beside its target.

A goal names the published figure it answers (docs/benchmarks/method.md, "Anchors"). A
goal whose runs are not in the reports given is left out; one whose figure is missing
from a run that should have it is "not measured", never met.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from deltabus_bench.anchors import ANCHORS, profile_key
from deltabus_bench.config import SERVER_CPU

Report = dict[str, Any]


@dataclass(frozen=True)
class Judged:
    goal: str
    figure: str
    target: str
    met: bool | None  # None: not measured
    why: str = ""  # where the measured reason of a miss is (a link into archive.md)

    @property
    def result(self) -> str:
        if self.met is False and self.why:
            return f"**missed**: {self.why}"
        return {True: "met", False: "**missed**", None: "not measured"}[self.met]


@dataclass(frozen=True)
class StoreGoal:
    """Latency at `rate` and the highest rate keeping up, for one store profile at 100 ms
    commits."""

    store: str
    rate: int
    p50: float
    p99: float
    highest: int
    anchor: str
    why_latency: str
    why_rate: str


STORE_GOALS = (
    StoreGoal(
        "s3-standard",
        10_000,
        0.22,
        0.45,
        250_000,
        "Bufstream 0.26 / 0.50 s on S3 Standard",
        "[round trips per hop](archive.md#s3-standard-at-10k-msgs-on-a-quiet-machine-with-"
        "and-without-pushed-events)",
        "[rate sweeps](archive.md#rate-sweeps-per-store-profile)",
    ),
    StoreGoal(
        "s3-express",
        10_000,
        0.15,
        0.25,
        400_000,
        "WarpStream < 0.20 / 0.40 s on S3 Express",
        "[rate sweeps](archive.md#rate-sweeps-per-store-profile)",
        "[CPU-bound on two cores](archive.md#s3-express-at-400000-msgs)",
    ),
)
SERVING_WHY = "[the node is out of CPU](archive.md#serving-opensearch-beside-postgresql)"
IDLE_EXTRA_S = 0.1  # the first messages after idle: within the loaded p99 + this
IDLE_REQUESTS_PER_S = 2.0
IDLE_CPU_PCT = 2.0
SERVE_SHARE = 0.8  # the sink keeps up at this share of the node's own bulk rate
SERVE_P99_S = 1.0  # searchable p99 at half of the node's own rate, at most


def _store(report: Report) -> str:
    return (report.get("store") or {}).get("profile", "loopback")


def _delta_runs(report: Report) -> list[dict[str, Any]]:
    return [r for r in report.get("runs", []) if r.get("backbone") == "delta"]


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _store_goals(report: Report) -> Iterator[Judged]:
    if report.get("profile") != "100ms":
        return
    for goal in STORE_GOALS:
        if _store(report) != goal.store:
            continue
        run = next((r for r in _delta_runs(report) if r["rate"] == goal.rate), None)
        if run is not None:
            p50, p99 = run.get("p50"), run.get("p99")
            met = None if p50 is None or p99 is None else p50 <= goal.p50 and p99 <= goal.p99
            yield Judged(
                f"{goal.store}, {goal.rate:,} msg/s: p50 / p99 (ahead of {goal.anchor})",
                f"{_s(p50)} / {_s(p99)}",
                f"≤ {goal.p50:.2f} / {goal.p99:.2f} s",
                met,
                goal.why_latency,
            )
        highest = (report.get("highest_keeping_up_rate") or {}).get("delta")
        yield Judged(
            f"{goal.store}: highest rate keeping up",
            "none" if highest is None else f"{highest:,} msg/s",
            f"≥ {goal.highest:,} msg/s",
            highest is not None and highest >= goal.highest,
            goal.why_rate,
        )


def _anchor_goals(report: Report) -> Iterator[Judged]:
    """On loopback: below Pathway's published Delta-on-MinIO figures at the rates they
    were published for (deltabus_bench.anchors)."""
    if _store(report) != "loopback" or not report.get("profile"):
        return
    anchors = ANCHORS.get(profile_key(str(report["profile"])), {})
    for run in _delta_runs(report):
        anchor = anchors.get(run["rate"])
        plain = not run.get("serving") and not (run.get("cost") or {}).get("idle")
        if anchor is None or not plain or run.get("etl", "pathway") != "pathway":
            continue
        p50, p99 = run.get("p50"), run.get("p99")
        met = None if p50 is None or p99 is None else p50 < anchor[0] and p99 < anchor[1]
        yield Judged(
            f"loopback, {report.get('profile')} commits, {run['rate']:,} msg/s: below "
            "Pathway's published Delta-on-MinIO p50 / p99",
            f"{_s(p50)} / {_s(p99)}",
            f"< {anchor[0]:.2f} / {anchor[1]:.2f} s",
            met,
        )


@dataclass(frozen=True)
class IdleFigures:
    """A run's idle measurement (`idle-s`), as report.json records it."""

    seconds: float
    cpu: dict[str, float]  # % of one core per component (the machine's share left out)
    requests_per_s: float | None
    first_after_s: float | None

    @property
    def busy(self) -> float:
        return sum(self.cpu.values())


def idle_figures(run: dict[str, Any]) -> IdleFigures | None:
    """The idle figures of `run`, or None when it measured no idle time."""
    idle = (run.get("cost") or {}).get("idle")
    if not idle:
        return None
    cpu = idle.get("cpu_pct_of_one_core") or {}
    return IdleFigures(
        seconds=idle.get("seconds", 0),
        cpu={k: v for k, v in cpu.items() if not k.startswith("machine")},
        requests_per_s=(idle.get("requests_per_s") or {}).get("total"),
        first_after_s=idle.get("first_after_idle_s"),
    )


def _idle_goals(report: Report) -> Iterator[Judged]:
    for run in _delta_runs(report):
        idle = idle_figures(run)
        if idle is None:
            continue
        busy, requests = idle.busy, idle.requests_per_s
        first, loaded = idle.first_after_s, run.get("p99")
        bound = None if loaded is None else loaded + IDLE_EXTRA_S
        met = (
            None
            if first is None or bound is None or requests is None
            else first <= bound and requests <= IDLE_REQUESTS_PER_S and busy <= IDLE_CPU_PCT
        )
        yield Judged(
            f"awake after {idle.seconds:g} s idle: first messages, requests, CPU",
            f"{_s(first)}, {'—' if requests is None else f'{requests:g}'} /s, {busy:.1f} %",
            f"≤ {_s(bound)} (loaded p99 + {IDLE_EXTRA_S:g} s), ≤ {IDLE_REQUESTS_PER_S:g} /s, "
            f"≤ {IDLE_CPU_PCT:g} % of a core",
            met,
        )


def _serving_goals(report: Report) -> Iterator[Judged]:
    runs = [r for r in _delta_runs(report) if (r.get("serving") or {}).get("backend")]
    raws = [
        raw["docs_per_s"]
        for r in runs
        if (raw := r["serving"].get("raw_capacity")) and raw.get("docs_per_s")
    ]
    if not runs or runs[0]["serving"]["backend"] != "opensearch":
        return
    if not raws:
        yield Judged("OpenSearch sink: share of the node's own bulk rate", "—", "", None)
        return
    raw = _upper_median(raws)
    served = (report.get("highest_keeping_up_rate") or {}).get("opensearch serving")
    yield Judged(
        "OpenSearch sink: highest rate served keeping up, against the node's own "
        f"`_bulk` rate (median {raw:,.0f} docs/s)",
        "none" if served is None else f"{served:,} msg/s ({served / raw:.0%})",
        f"≥ {SERVE_SHARE:.0%} ({SERVE_SHARE * raw:,.0f} msg/s)",
        served is not None and served >= SERVE_SHARE * raw,
        SERVING_WHY + serving_cpu_budget(runs, SERVE_SHARE * raw, report.get("machine", "")),
    )
    half = [r for r in runs if r["rate"] <= raw / 2]
    if half:
        run = max(half, key=lambda r: r["rate"])
        p99 = (run["serving"].get("unified_commit_to_opensearch") or {}).get("p99")
        yield Judged(
            f"OpenSearch sink: searchable p99 at {run['rate']:,} msg/s (at most half the "
            "node's rate)",
            _s(p99),
            f"≤ {SERVE_P99_S:g} s",
            None if p99 is None else p99 <= SERVE_P99_S,
            SERVING_WHY,
        )


def _upper_median(values: list[float]) -> float:
    """The middle value, the upper of the two middle ones for an even count."""
    return sorted(values)[len(values) // 2]


def serving_cpu_budget(runs: list[dict[str, Any]], rate: float, machine: str) -> str:
    """What serving `rate` msg/s would take of the machine's cores: the node at its CPU
    per document alone (median of the runs' raw measurements), and every other component
    at its CPU per message in the highest-rate run (a lower bound: costs per message fall
    as the rate rises); empty when a figure is missing."""
    alone = [
        cpu
        for r in runs
        if (cpu := (r["serving"].get("raw_capacity") or {}).get("node_cpu_s_per_million_docs"))
    ]
    cores = re.match(r"(\d+) cores", machine)
    top = max(runs, key=lambda r: r["rate"])
    per_msg = (top.get("cost") or {}).get("cpu_s_per_million_msgs") or {}
    if not alone or cores is None or not per_msg:
        return ""
    node = _upper_median(alone) * rate / 1e6
    server = SERVER_CPU["opensearch"]
    rest = sum(v for k, v in per_msg.items() if k != server) * rate / 1e6
    return (
        f": at {rate:,.0f} msg/s the node alone would take {node:.1f} cores and the rest at "
        f"least {rest:.1f}, of {cores.group(1)}"
    )


JUDGES: tuple[Callable[[Report], Iterator[Judged]], ...] = (
    _anchor_goals,
    _store_goals,
    _idle_goals,
    _serving_goals,
)


def judge(reports: list[Report]) -> list[Judged]:
    """Every goal the reports can answer, in report order."""
    return [j for report in reports for judge_one in JUDGES for j in judge_one(report)]


def goal_table(reports: list[Report]) -> list[str]:
    """The goals as Markdown table lines (none when no report answers one)."""
    judged = judge(reports)
    if not judged:
        return []
    return [
        "| goal | figure | target | result |",
        "|---|---|---|---|",
        *(f"| {j.goal} | {j.figure} | {j.target} | {j.result} |" for j in judged),
    ]
