"""The parts of a benchmark run's results (deltabus_bench.results): its verdict,
cost (and idle cost), stage latencies and serving stage. Every record is a frozen
pydantic `Record`: `model_validate` reads its JSON in report.json or runs/*.json and
`to_dict()` writes it, key for key in field order. A key older files lack, or a null
where the default is not None, reads as the field's default."""

from __future__ import annotations

import operator
from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from pydantic import SerializerFunctionWrapHandler as Handler

Json = dict[str, Any]
Num = int | float  # a measured number: ints stay ints and floats floats, as the JSON has them

# `Field(None, exclude_if=is_none)`: a field written only when it is set.
is_none = partial(operator.is_, None)


class Record(BaseModel):
    """A frozen result record, readable by its JSON keys or its field names."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """A null reads as the field's default, unless that default is None."""
        if not isinstance(data, dict):
            return data
        fields = {k: f for n, f in cls.model_fields.items() for k in (n, f.alias or n)}
        nullable = {k for k, f in fields.items() if f.default is None}
        return {k: v for k, v in data.items() if v is not None or k in nullable}

    def to_dict(self) -> Json:
        """The record as report.json and runs/*.json store it."""
        return self.model_dump()


class Verdict(Record):
    """Did a run keep up (deltabus_bench.verdict.classify), with the figures the
    verdict rests on; `unseen_after_warmup` is written only when non-zero."""

    verdict: str = ""
    p99_bound_s: Num = 0.0
    backlog_at_end_s: Num | None = None
    quarter_p50_s: list[Num] = []
    growth_s: Num | None = None
    slope_s_per_s: Num | None = None
    grows: bool = False
    unseen_after_warmup: int = Field(0, exclude_if=operator.not_)
    rule: str = ""


class Idle(Record):
    """The pipeline running without traffic (`--idle-s`): its CPU (% of one core, overall
    and per minute), its requests per second when a meter ran (null when the metrics were
    unreadable), and, when the probe after it arrived, the first messages' latency. The
    last three keys are written only when given (measure_idle, first_after_idle)."""

    seconds: Num = 0.0
    cpu_pct_of_one_core: dict[str, Num] = {}
    by_minute: list[dict[str, Num]] = []
    requests_per_s: dict[str, Num] | None = None
    first_after_idle_s: Num | None = None
    producer_start_to_seen_s: Num | None = None

    @model_serializer(mode="wrap")
    def _given_only(self, handler: Handler) -> Json:
        always = {"seconds", "cpu_pct_of_one_core", "by_minute"}
        return {k: v for k, v in handler(self).items() if k in always | self.model_fields_set}


class Cost(Record):
    """What a run's messages cost (deltabus_bench.cost.cost_summary): CPU per
    component, the machine's CPU (written when measured), object-store requests and their
    bill (written when MinIO's metrics were read), and the idle pipeline's (`--idle-s`)."""

    cpu_pct_of_one_core: dict[str, Num] = {}
    cpu_s_per_million_msgs: dict[str, Num] = {}
    cpu_s_per_million_msgs_total: Num | None = None
    cpu_cores_total: Num | None = None
    machine: dict[str, Num] = Field({}, exclude_if=operator.not_)
    requests_per_s: dict[str, Num] | None = Field(None, exclude_if=is_none)
    requests_per_million_msgs: Num | None = Field(None, exclude_if=is_none)
    request_cost_usd_per_day: Num | None = Field(None, exclude_if=is_none)
    prices: str | None = Field(None, exclude_if=is_none)
    idle: Idle | None = Field(None, exclude_if=is_none)


class StageLatency(Record):
    """One stage's p50 and p99 (s), and both measured from the send time."""

    p50: Num | None = None
    p99: Num | None = None
    p50_since_sent: Num | None = None
    p99_since_sent: Num | None = None


class Percentiles(Record):
    """p50, p99, p99.9 and max (s) of a serving segment."""

    p50: Num | None = None
    p99: Num | None = None
    p99_9: Num | None = Field(None, alias="p99.9")
    max: Num | None = None


class ServingReplay(Record):
    """`--serve-replay`: a fresh sink alone loading the unified table into `target`."""

    target: str | None = None
    rows: int | None = None
    elapsed_s: Num | None = None
    rows_per_s: Num | None = None
    sink_cpu_s: Num | None = None
    server_cpu_s: Num | None = None
    sink_report: Json = {}


class Serving(Record):
    """`--serve postgres|opensearch`: the stage unified commit → served (`stage`) and sent
    → served (`end_to_end`), the sink's verdict, messages never served, and the sink's and
    server's CPU. The two stages are stored under `unified_commit_to_<backend>` and
    `sent_to_<backend>`; a run recorded before OpenSearch existed served PostgreSQL.
    `refresh_interval_ms`, `in_flight` and `raw_capacity` (OpenSearch: plain `_bulk`
    requests into a scratch index before the run) and `replay` (`--serve-replay`) are
    written when set."""

    backend: str = "postgres"
    samples: int = 0
    not_served: int = 0
    stage: Percentiles = Percentiles()
    end_to_end: Percentiles = Percentiles()
    verdict: str = ""
    behind: Verdict = Verdict()
    refresh_interval_ms: int | None = Field(None, exclude_if=is_none)
    in_flight: int | None = Field(None, exclude_if=is_none)
    raw_capacity: Json | None = Field(None, exclude_if=is_none)
    cpu_pct_of_one_core: dict[str, Num] = {}
    sink_report: Json | None = None
    replay: ServingReplay | None = Field(None, exclude_if=is_none)

    @staticmethod
    def _stored_keys(backend: str) -> dict[str, str]:
        return {"stage": f"unified_commit_to_{backend}", "end_to_end": f"sent_to_{backend}"}

    @model_validator(mode="before")
    @classmethod
    def _from_stored_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "stage" in data or "end_to_end" in data:
            return data
        backend = data.get("backend") or "postgres"
        stored = cls._stored_keys(backend).items()
        renamed = {name: data[key] for name, key in stored if data.get(key) is not None}
        return data | {"backend": backend} | renamed

    @model_serializer(mode="wrap")
    def _to_stored_keys(self, handler: Handler) -> Json:
        stored = self._stored_keys(self.backend)
        return {stored.get(k, k): v for k, v in handler(self).items()}
