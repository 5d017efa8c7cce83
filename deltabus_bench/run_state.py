"""What one benchmark run observed as it went (`RunState`), handed from the driving loop
and the drivers to the evaluation (deltabus_bench.evaluate)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from deltabus_bench.workload import ProducerSpec


@dataclass
class Drain:
    """A backlog drain as it happens: how the ETL went down and when, and once it is back,
    when it resumed (epoch ms) and how long its restart took to be ready (SIGTERM only)."""

    signal: str  # "term" or "stop" (--drain-signal)
    down_ms: float
    resuming: bool = False
    resumed_ms: float | None = None
    restart_ready_s: float | None = None


@dataclass
class RunState:
    """What a run observed, handed from the driving loop to the analysis."""

    backbone: str
    rate: int
    start_ms: float = 0.0
    specs: list[ProducerSpec] = field(default_factory=list)
    producer_reports: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    drain: Drain | None = None
    maintenance: list[dict] = field(default_factory=list)
    cpu: dict = field(default_factory=dict)
    etl_reports: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    requests: dict | None = None  # object-store requests per second by class (MinIO metrics)
    idle: dict | None = None  # cost with the pipeline running and no traffic
    served: pa.Table | None = None  # --serve: when each message became visible in the store
    serving_report: dict | None = None  # --serve: the sink's own report
    serving_replay: dict | None = None  # --serve-replay: the sink alone loading the table
    serving_raw: dict | None = None  # --serve opensearch: plain _bulk requests, no sink
