"""A benchmark run's results as typed records: `RunSummary` (a row of report.json's
`runs`), `RunDetail` (runs/<backbone>-<rate>.json: the summary and everything else), and
the backlog drain and soak of a detail. Their parts (verdict, cost, stages, serving) are
in deltabus.adapters.bench.result_parts.

`to_dict()` gives each record's JSON shape, key for key and in order, as report.json and
runs/*.json store it; `from_dict()` reads a stored one back, filling what older files lack
with defaults (a run recorded before `--etl` existed ran Pathway's ETL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deltabus.adapters.bench.result_parts import (
    Cost,
    Idle,
    Json,
    Percentiles,
    Serving,
    ServingReplay,
    StageLatency,
    Verdict,
)

__all__ = [
    "Cost",
    "DrainResult",
    "Idle",
    "Percentiles",
    "Quarter",
    "RunDetail",
    "RunSummary",
    "Serving",
    "ServingReplay",
    "SoakResult",
    "StageLatency",
    "Verdict",
]


@dataclass(frozen=True)
class DrainResult:
    """A backlog drain (`--backlog-drain`): when the ETL went down and for how long, its
    restart (SIGTERM only), the backlog, and when latency was back (None: not within the
    run), by the rule stated in `rule` (deltabus.adapters.bench.analysis.recovery)."""

    signal: str
    restart_ready_s: float | None
    down_at_s: float
    down_s: float | None = None
    backlog_messages: int = 0
    peak_latency_s: float | None = None
    backlog_drained_s: float | None = None
    threshold_s: float | None = None
    recovery_s_p99: float | None = None
    recovery_s_p50: float | None = None
    baseline_p99_s: float | None = None
    recovery_s_to_2x_baseline_p99: float | None = None
    rule: str = ""

    def to_dict(self) -> Json:
        return {
            "signal": self.signal,
            "restart_ready_s": self.restart_ready_s,
            "down_at_s": self.down_at_s,
            "down_s": self.down_s,
            "backlog_messages": self.backlog_messages,
            "peak_latency_s": self.peak_latency_s,
            "backlog_drained_s": self.backlog_drained_s,
            "threshold_s": self.threshold_s,
            "recovery_s_p99": self.recovery_s_p99,
            "recovery_s_p50": self.recovery_s_p50,
            "baseline_p99_s": self.baseline_p99_s,
            "recovery_s_to_2x_baseline_p99": self.recovery_s_to_2x_baseline_p99,
            "rule": self.rule,
        }

    @classmethod
    def from_dict(cls, d: Json) -> DrainResult:
        """A stored drain, or the drain's timing (`signal`, `restart_ready_s`,
        `down_at_s`) merged with analysis.recovery's figures."""
        return cls(
            signal=d.get("signal", "term"),
            restart_ready_s=d.get("restart_ready_s"),
            down_at_s=d.get("down_at_s", 0.0),
            down_s=d.get("down_s"),
            backlog_messages=d.get("backlog_messages", 0),
            peak_latency_s=d.get("peak_latency_s"),
            backlog_drained_s=d.get("backlog_drained_s"),
            threshold_s=d.get("threshold_s"),
            recovery_s_p99=d.get("recovery_s_p99"),
            recovery_s_p50=d.get("recovery_s_p50"),
            baseline_p99_s=d.get("baseline_p99_s"),
            recovery_s_to_2x_baseline_p99=d.get("recovery_s_to_2x_baseline_p99"),
            rule=d.get("rule", ""),
        )


@dataclass(frozen=True)
class Quarter:
    """p50 and p99 (s) of one quarter (1..4) of a soak's post-warm-up span."""

    quarter: int
    p50: float | None
    p99: float | None

    def to_dict(self) -> Json:
        return {"quarter": self.quarter, "p50": self.p50, "p99": self.p99}

    @classmethod
    def from_dict(cls, d: Json) -> Quarter:
        return cls(d["quarter"], d.get("p50"), d.get("p99"))


@dataclass(frozen=True)
class SoakResult:
    """A soak with maintenance (`--soak`): its passes (when they started and how long they
    took, s), their errors, latency per quarter, and each table's version and file count
    at the end."""

    maintenance_passes: int
    maintenance_errors: list[Json] = field(default_factory=list)
    maintenance_at_s: list[float] = field(default_factory=list)
    maintenance_duration_s: list[float] = field(default_factory=list)
    quarters: list[Quarter] = field(default_factory=list)
    tables: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> Json:
        return {
            "maintenance_passes": self.maintenance_passes,
            "maintenance_errors": self.maintenance_errors,
            "maintenance_at_s": self.maintenance_at_s,
            "maintenance_duration_s": self.maintenance_duration_s,
            "quarters": [q.to_dict() for q in self.quarters],
            "tables": self.tables,
        }

    @classmethod
    def from_dict(cls, d: Json) -> SoakResult:
        return cls(
            maintenance_passes=d.get("maintenance_passes", 0),
            maintenance_errors=list(d.get("maintenance_errors") or []),
            maintenance_at_s=list(d.get("maintenance_at_s") or []),
            maintenance_duration_s=list(d.get("maintenance_duration_s") or []),
            quarters=[Quarter.from_dict(q) for q in d.get("quarters") or []],
            tables=dict(d.get("tables") or {}),
        )


@dataclass(frozen=True)
class RunSummary:
    """One run's summary: end-to-end percentiles after the warm-up (s), the accounting,
    the achieved rate, the verdict's word (verdict.KEEPING_UP, OVER_BOUND or BEHIND), the
    stages (report order), the cost and, with `--serve`, the serving stage."""

    rate: int
    backbone: str
    etl: str = "pathway"
    samples: int = 0
    messages: int = 0
    lost: int = 0
    p50: float | None = None
    p75: float | None = None
    p85: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_9: float | None = None
    max: float | None = None
    achieved_rate: float = 0.0
    max_lag_s: float | None = None
    verdict: str = ""
    fell_behind: bool = False
    stages: dict[str, StageLatency] = field(default_factory=dict)
    cost: Cost = field(default_factory=Cost)
    serving: Serving | None = None

    @property
    def key(self) -> str:
        """`<backbone>-<rate>`: the name of the run's detail file and plot."""
        return f"{self.backbone}-{self.rate}"

    def percentile(self, name: str) -> float | None:
        """The end-to-end percentile by its report name: p50 .. p99, "p99.9" or "max"."""
        return {"p99.9": self.p99_9}.get(name, getattr(self, name, None))

    def to_dict(self) -> Json:
        return {
            "rate": self.rate,
            "backbone": self.backbone,
            "etl": self.etl,
            "samples": self.samples,
            "messages": self.messages,
            "lost": self.lost,
            "p50": self.p50,
            "p75": self.p75,
            "p85": self.p85,
            "p95": self.p95,
            "p99": self.p99,
            "p99.9": self.p99_9,
            "max": self.max,
            "achieved_rate": self.achieved_rate,
            "max_lag_s": self.max_lag_s,
            "verdict": self.verdict,
            "fell_behind": self.fell_behind,
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "cost": self.cost.to_dict(),
            **({"serving": self.serving.to_dict()} if self.serving is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Json) -> RunSummary:
        """A row of report.json's `runs`, or the summary within a runs/*.json detail."""
        stages = d.get("stages") or {}
        return cls(
            rate=d["rate"],
            backbone=d["backbone"],
            etl=d.get("etl", "pathway"),
            samples=d.get("samples") or 0,
            messages=d.get("messages") or 0,
            lost=d.get("lost") or 0,
            p50=d.get("p50"),
            p75=d.get("p75"),
            p85=d.get("p85"),
            p95=d.get("p95"),
            p99=d.get("p99"),
            p99_9=d.get("p99.9"),
            max=d.get("max"),
            achieved_rate=d.get("achieved_rate") or 0.0,
            max_lag_s=d.get("max_lag_s"),
            verdict=d.get("verdict", ""),
            fell_behind=bool(d.get("fell_behind", False)),
            stages={name: StageLatency.from_dict(s) for name, s in stages.items()},
            cost=Cost.from_dict(d.get("cost")),
            serving=Serving.from_dict(d["serving"]) if d.get("serving") is not None else None,
        )


@dataclass(frozen=True)
class RunDetail:
    """runs/<backbone>-<rate>.json: the run's summary, its configuration, the producers'
    and ETL's own reports, CPU per process, the accounting of messages, the verdict's
    figures (`behind`), errors and notes, the series over time and, when run, the
    backlog drain and the soak. Series, reports and checks are stored as measured."""

    summary: RunSummary
    profile: str = ""
    store: str = "loopback"
    lake_prefix: str = ""
    samples_table: str = ""
    schedule_start_ms: float = 0.0
    warmup_s: float = 0.0
    duration_s: float = 0.0
    producers: list[Json] = field(default_factory=list)
    producer_reports: list[Json] = field(default_factory=list)
    producer_mode: str = ""
    partitions: int = 1
    partitioner: str = ""
    etl_processes: int = 1
    etl_reports: list[Json] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    samples_including_warmup: int = 0
    lost_during_warmup: int = 0
    lost_examples: list[str] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=dict)
    behind: Verdict = field(default_factory=lambda: Verdict.from_dict(None))
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    over_time: list[dict[str, Any]] = field(default_factory=list)
    stages_over_time: list[dict[str, Any]] = field(default_factory=list)
    drain: DrainResult | None = None
    soak: SoakResult | None = None
    checks_failed: list[str] = field(default_factory=list)  # older files only

    def to_dict(self) -> Json:
        out = self.summary.to_dict() | {
            "profile": self.profile,
            "store": self.store,
            "lake_prefix": self.lake_prefix,
            "samples_table": self.samples_table,
            "schedule_start_ms": self.schedule_start_ms,
            "warmup_s": self.warmup_s,
            "duration_s": self.duration_s,
            "producers": self.producers,
            "producer_reports": self.producer_reports,
            "producer_mode": self.producer_mode,
            "partitions": self.partitions,
            "partitioner": self.partitioner,
            "etl_processes": self.etl_processes,
            "etl_reports": self.etl_reports,
            "cpu": self.cpu,
            "timings": self.timings,
            "samples_including_warmup": self.samples_including_warmup,
            "lost_during_warmup": self.lost_during_warmup,
            "lost_examples": self.lost_examples,
            "checks": self.checks,
            "behind": self.behind.to_dict(),
            "errors": self.errors,
            "notes": self.notes,
            "over_time": self.over_time,
            "stages_over_time": self.stages_over_time,
        }
        if self.drain is not None:
            out["drain"] = self.drain.to_dict()
        if self.soak is not None:
            out["soak"] = self.soak.to_dict()
        if self.checks_failed:
            out["checks_failed"] = self.checks_failed
        return out

    @classmethod
    def from_dict(cls, d: Json) -> RunDetail:
        return cls(
            summary=RunSummary.from_dict(d),
            profile=d.get("profile", ""),
            store=d.get("store", "loopback"),
            lake_prefix=d.get("lake_prefix", ""),
            samples_table=d.get("samples_table", ""),
            schedule_start_ms=d.get("schedule_start_ms", 0.0),
            warmup_s=d.get("warmup_s", 0.0),
            duration_s=d.get("duration_s", 0.0),
            producers=list(d.get("producers") or []),
            producer_reports=list(d.get("producer_reports") or []),
            producer_mode=d.get("producer_mode", ""),
            partitions=d.get("partitions", 1),
            partitioner=d.get("partitioner", ""),
            etl_processes=d.get("etl_processes", 1),
            etl_reports=list(d.get("etl_reports") or []),
            cpu=dict(d.get("cpu") or {}),
            timings=dict(d.get("timings") or {}),
            samples_including_warmup=d.get("samples_including_warmup", 0),
            lost_during_warmup=d.get("lost_during_warmup", 0),
            lost_examples=list(d.get("lost_examples") or []),
            checks=dict(d.get("checks") or {}),
            behind=Verdict.from_dict(d.get("behind")),
            errors=list(d.get("errors") or []),
            notes=list(d.get("notes") or []),
            over_time=list(d.get("over_time") or []),
            stages_over_time=list(d.get("stages_over_time") or []),
            drain=DrainResult.from_dict(d["drain"]) if d.get("drain") else None,
            soak=SoakResult.from_dict(d["soak"]) if d.get("soak") else None,
            checks_failed=list(d.get("checks_failed") or []),
        )
