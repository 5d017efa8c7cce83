"""A benchmark run's results: `RunSummary` (a row of report.json's `runs`), `RunDetail`
(runs/<backbone>-<rate>.json: the summary and everything else), and a detail's backlog
drain and soak. Their parts and the `Record` base (read with `model_validate`, written
with `to_dict()`) are in deltabus_bench.result_parts."""

from __future__ import annotations

import operator
from typing import Any

from pydantic import Field, model_serializer, model_validator
from pydantic import SerializerFunctionWrapHandler as Handler

from deltabus_bench.result_parts import (
    Cost,
    Json,
    Num,
    Record,
    Serving,
    StageLatency,
    Verdict,
    is_none,
)


class DrainResult(Record):
    """A backlog drain (`--backlog-drain`): when the ETL went down and for how long, its
    restart (SIGTERM only), the backlog, and when latency was back (None: not within the
    run), by the rule stated in `rule` (deltabus_bench.analysis.recovery)."""

    signal: str = "term"
    restart_ready_s: Num | None = None
    down_at_s: Num = 0.0
    down_s: Num | None = None
    backlog_messages: int = 0
    peak_latency_s: Num | None = None
    backlog_drained_s: Num | None = None
    threshold_s: Num | None = None
    recovery_s_p99: Num | None = None
    recovery_s_p50: Num | None = None
    baseline_p99_s: Num | None = None
    recovery_s_to_2x_baseline_p99: Num | None = None
    rule: str = ""


class Quarter(Record):
    """p50 and p99 (s) of one quarter (1..4) of a soak's post-warm-up span."""

    quarter: int
    p50: Num | None = None
    p99: Num | None = None


class SoakResult(Record):
    """A soak with maintenance (`--soak`): its passes (when they started and how long they
    took, s), their errors, latency per quarter, and each table's version and file count
    at the end."""

    maintenance_passes: int = 0
    maintenance_errors: list[Json] = []
    maintenance_at_s: list[Num] = []
    maintenance_duration_s: list[Num] = []
    quarters: list[Quarter] = []
    tables: dict[str, dict[str, int]] = {}


class RunSummary(Record):
    """One run's summary: end-to-end percentiles after the warm-up (s), the accounting,
    the achieved rate, the verdict's word (verdict.KEEPING_UP, OVER_BOUND or BEHIND), the
    stages (report order), the cost and, with `--serve`, the serving stage (written when
    set). A run recorded before `--etl` existed ran Pathway's ETL."""

    rate: int
    backbone: str
    etl: str = "pathway"
    samples: int = 0
    messages: int = 0
    lost: int = 0
    p50: Num | None = None
    p75: Num | None = None
    p85: Num | None = None
    p95: Num | None = None
    p99: Num | None = None
    p99_9: Num | None = Field(None, alias="p99.9")
    max: Num | None = None
    achieved_rate: Num = 0.0
    max_lag_s: Num | None = None
    verdict: str = ""
    fell_behind: bool = False
    stages: dict[str, StageLatency] = {}
    cost: Cost = Cost()
    serving: Serving | None = Field(None, exclude_if=is_none)

    @property
    def key(self) -> str:
        """`<backbone>-<rate>`: the name of the run's detail file and plot."""
        return f"{self.backbone}-{self.rate}"

    def percentile(self, name: str) -> float | None:
        """The end-to-end percentile by its report name: p50 .. p99, "p99.9" or "max"."""
        return {"p99.9": self.p99_9}.get(name, getattr(self, name, None))


class RunDetail(Record):
    """runs/<backbone>-<rate>.json: the run's summary (stored flat, its keys first), its
    configuration, the producers' and ETL's own reports, CPU per process, the accounting
    of messages, the verdict's figures (`behind`), errors and notes, the series over time
    and, when run, the backlog drain and the soak (written when set; `checks_failed`, of
    older files, when not empty). Series, reports and checks are stored as measured."""

    summary: RunSummary
    profile: str = ""
    store: str = "loopback"
    lake_prefix: str = ""
    samples_table: str = ""
    schedule_start_ms: Num = 0.0
    warmup_s: Num = 0.0
    duration_s: Num = 0.0
    producers: list[Json] = []
    producer_reports: list[Json] = []
    producer_mode: str = ""
    partitions: int = 1
    partitioner: str = ""
    etl_processes: int = 1
    etl_reports: list[Json] = []
    cpu: dict[str, Num] = {}
    timings: dict[str, Num] = {}
    samples_including_warmup: int = 0
    lost_during_warmup: int = 0
    lost_examples: list[str] = []
    checks: dict[str, int] = {}
    behind: Verdict = Verdict()
    errors: list[str] = []
    notes: list[str] = []
    over_time: list[Json] = []
    stages_over_time: list[Json] = []
    drain: DrainResult | None = Field(None, exclude_if=is_none)
    soak: SoakResult | None = Field(None, exclude_if=is_none)
    checks_failed: list[str] = Field([], exclude_if=operator.not_)

    @model_validator(mode="before")
    @classmethod
    def _summary_from_flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "summary" not in data:
            return data | {"summary": data}
        return data

    @model_serializer(mode="wrap")
    def _summary_flat(self, handler: Handler) -> Json:
        out = handler(self)
        return out.pop("summary") | out
