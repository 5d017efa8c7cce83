"""The parts of a benchmark run's results (deltabus.adapters.bench.results): its verdict,
cost (and idle cost), stage latencies and serving stage, as typed records.

`to_dict()` gives each record's JSON shape, key for key and in order, as report.json and
runs/*.json store it; `from_dict()` reads a stored one back, filling what older files lack
with defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """Did a run keep up (deltabus.adapters.bench.verdict.classify), with the figures the
    verdict rests on; `unseen_after_warmup` is written only when non-zero."""

    verdict: str
    p99_bound_s: float
    backlog_at_end_s: float | None
    quarter_p50_s: list[float]
    growth_s: float | None
    slope_s_per_s: float | None
    grows: bool
    rule: str
    unseen_after_warmup: int = 0

    def to_dict(self) -> Json:
        return {
            "verdict": self.verdict,
            "p99_bound_s": self.p99_bound_s,
            "backlog_at_end_s": self.backlog_at_end_s,
            "quarter_p50_s": self.quarter_p50_s,
            "growth_s": self.growth_s,
            "slope_s_per_s": self.slope_s_per_s,
            "grows": self.grows,
            **(
                {"unseen_after_warmup": self.unseen_after_warmup}
                if self.unseen_after_warmup
                else {}
            ),
            "rule": self.rule,
        }

    @classmethod
    def from_dict(cls, d: Json | None) -> Verdict:
        d = d or {}
        return cls(
            verdict=d.get("verdict", ""),
            p99_bound_s=d.get("p99_bound_s", 0.0),
            backlog_at_end_s=d.get("backlog_at_end_s"),
            quarter_p50_s=list(d.get("quarter_p50_s") or []),
            growth_s=d.get("growth_s"),
            slope_s_per_s=d.get("slope_s_per_s"),
            grows=bool(d.get("grows", False)),
            rule=d.get("rule", ""),
            unseen_after_warmup=int(d.get("unseen_after_warmup", 0)),
        )


@dataclass(frozen=True)
class Idle:
    """The pipeline running without traffic (`--idle-s`): its CPU (% of one core, overall
    and per minute), its requests per second when a meter ran (`requests_metered`: the
    key is written, null when the metrics were unreadable), and, when the probe after it
    arrived (`probed`), the first messages' latency."""

    seconds: float
    cpu_pct_of_one_core: dict[str, float]
    by_minute: list[dict[str, float]] = field(default_factory=list)
    requests_metered: bool = False
    requests_per_s: dict[str, float] | None = None
    probed: bool = False
    first_after_idle_s: float | None = None
    producer_start_to_seen_s: float | None = None

    def to_dict(self) -> Json:
        out: Json = {
            "seconds": self.seconds,
            "cpu_pct_of_one_core": self.cpu_pct_of_one_core,
            "by_minute": self.by_minute,
        }
        if self.requests_metered:
            out["requests_per_s"] = self.requests_per_s
        if self.probed:
            out["first_after_idle_s"] = self.first_after_idle_s
            out["producer_start_to_seen_s"] = self.producer_start_to_seen_s
        return out

    @classmethod
    def from_dict(cls, d: Json) -> Idle:
        return cls(
            seconds=d.get("seconds", 0.0),
            cpu_pct_of_one_core=dict(d.get("cpu_pct_of_one_core") or {}),
            by_minute=list(d.get("by_minute") or []),
            requests_metered="requests_per_s" in d,
            requests_per_s=d.get("requests_per_s"),
            probed="first_after_idle_s" in d,
            first_after_idle_s=d.get("first_after_idle_s"),
            producer_start_to_seen_s=d.get("producer_start_to_seen_s"),
        )


@dataclass(frozen=True)
class Cost:
    """What a run's messages cost (deltabus.adapters.bench.cost.cost_summary): CPU per
    component, the machine's CPU (written when measured), object-store requests and their
    bill (written when MinIO's metrics were read), and the idle pipeline's (`--idle-s`)."""

    cpu_pct_of_one_core: dict[str, float] = field(default_factory=dict)
    cpu_s_per_million_msgs: dict[str, float] = field(default_factory=dict)
    cpu_s_per_million_msgs_total: float | None = None
    cpu_cores_total: float | None = None
    machine: dict[str, float] = field(default_factory=dict)
    requests_per_s: dict[str, float] | None = None
    requests_per_million_msgs: float | None = None
    request_cost_usd_per_day: float | None = None
    prices: str | None = None
    idle: Idle | None = None

    def to_dict(self) -> Json:
        out: Json = {
            "cpu_pct_of_one_core": self.cpu_pct_of_one_core,
            "cpu_s_per_million_msgs": self.cpu_s_per_million_msgs,
            "cpu_s_per_million_msgs_total": self.cpu_s_per_million_msgs_total,
            "cpu_cores_total": self.cpu_cores_total,
        }
        if self.machine:
            out["machine"] = self.machine
        if self.requests_per_s is not None:
            out["requests_per_s"] = self.requests_per_s
            out["requests_per_million_msgs"] = self.requests_per_million_msgs
            out["request_cost_usd_per_day"] = self.request_cost_usd_per_day
            out["prices"] = self.prices
        if self.idle is not None:
            out["idle"] = self.idle.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Json | None) -> Cost:
        d = d or {}
        return cls(
            cpu_pct_of_one_core=dict(d.get("cpu_pct_of_one_core") or {}),
            cpu_s_per_million_msgs=dict(d.get("cpu_s_per_million_msgs") or {}),
            cpu_s_per_million_msgs_total=d.get("cpu_s_per_million_msgs_total"),
            cpu_cores_total=d.get("cpu_cores_total"),
            machine=dict(d.get("machine") or {}),
            requests_per_s=d.get("requests_per_s"),
            requests_per_million_msgs=d.get("requests_per_million_msgs"),
            request_cost_usd_per_day=d.get("request_cost_usd_per_day"),
            prices=d.get("prices"),
            idle=Idle.from_dict(d["idle"]) if d.get("idle") else None,
        )


@dataclass(frozen=True)
class StageLatency:
    """One stage's p50 and p99 (s), and both measured from the send time."""

    p50: float | None = None
    p99: float | None = None
    p50_since_sent: float | None = None
    p99_since_sent: float | None = None

    def to_dict(self) -> Json:
        return {
            "p50": self.p50,
            "p99": self.p99,
            "p50_since_sent": self.p50_since_sent,
            "p99_since_sent": self.p99_since_sent,
        }

    @classmethod
    def from_dict(cls, d: Json) -> StageLatency:
        return cls(d.get("p50"), d.get("p99"), d.get("p50_since_sent"), d.get("p99_since_sent"))


@dataclass(frozen=True)
class Percentiles:
    """p50, p99, p99.9 and max (s) of a serving segment."""

    p50: float | None = None
    p99: float | None = None
    p99_9: float | None = None
    max: float | None = None

    def to_dict(self) -> Json:
        return {"p50": self.p50, "p99": self.p99, "p99.9": self.p99_9, "max": self.max}

    @classmethod
    def from_dict(cls, d: Json | None) -> Percentiles:
        d = d or {}
        return cls(d.get("p50"), d.get("p99"), d.get("p99.9"), d.get("max"))


@dataclass(frozen=True)
class ServingReplay:
    """`--serve-replay`: a fresh sink alone loading the unified table into `target`."""

    target: str | None = None
    rows: int | None = None
    elapsed_s: float | None = None
    rows_per_s: float | None = None
    sink_cpu_s: float | None = None
    server_cpu_s: float | None = None
    sink_report: Json = field(default_factory=dict)

    def to_dict(self) -> Json:
        return {
            "target": self.target,
            "rows": self.rows,
            "elapsed_s": self.elapsed_s,
            "rows_per_s": self.rows_per_s,
            "sink_cpu_s": self.sink_cpu_s,
            "server_cpu_s": self.server_cpu_s,
            "sink_report": self.sink_report,
        }

    @classmethod
    def from_dict(cls, d: Json) -> ServingReplay:
        return cls(
            target=d.get("target"),
            rows=d.get("rows"),
            elapsed_s=d.get("elapsed_s"),
            rows_per_s=d.get("rows_per_s"),
            sink_cpu_s=d.get("sink_cpu_s"),
            server_cpu_s=d.get("server_cpu_s"),
            sink_report=dict(d.get("sink_report") or {}),
        )


@dataclass(frozen=True)
class Serving:
    """`--serve postgres|opensearch`: the stage unified commit → served and sent → served,
    the sink's verdict, messages never served, and the sink's and server's CPU. Stored
    under `unified_commit_to_<backend>` and `sent_to_<backend>`; a run recorded before
    OpenSearch existed served PostgreSQL. `refresh_interval_ms` (OpenSearch) and
    `replay` (`--serve-replay`) are written when set."""

    backend: str
    samples: int
    not_served: int
    stage: Percentiles
    end_to_end: Percentiles
    verdict: str
    behind: Verdict
    refresh_interval_ms: int | None = None
    cpu_pct_of_one_core: dict[str, float] = field(default_factory=dict)
    sink_report: Json | None = None
    replay: ServingReplay | None = None

    def to_dict(self) -> Json:
        out: Json = {
            "backend": self.backend,
            "samples": self.samples,
            "not_served": self.not_served,
            f"unified_commit_to_{self.backend}": self.stage.to_dict(),
            f"sent_to_{self.backend}": self.end_to_end.to_dict(),
            "verdict": self.verdict,
            "behind": self.behind.to_dict(),
        }
        if self.refresh_interval_ms is not None:
            out["refresh_interval_ms"] = self.refresh_interval_ms
        out["cpu_pct_of_one_core"] = self.cpu_pct_of_one_core
        out["sink_report"] = self.sink_report
        if self.replay is not None:
            out["replay"] = self.replay.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Json) -> Serving:
        backend = str(d.get("backend", "postgres"))
        return cls(
            backend=backend,
            samples=d.get("samples", 0),
            not_served=d.get("not_served", 0),
            stage=Percentiles.from_dict(d.get(f"unified_commit_to_{backend}")),
            end_to_end=Percentiles.from_dict(d.get(f"sent_to_{backend}")),
            verdict=d.get("verdict", ""),
            behind=Verdict.from_dict(d.get("behind")),
            refresh_interval_ms=d.get("refresh_interval_ms"),
            cpu_pct_of_one_core=dict(d.get("cpu_pct_of_one_core") or {}),
            sink_report=d.get("sink_report"),
            replay=ServingReplay.from_dict(d["replay"]) if d.get("replay") else None,
        )
