"""One benchmark run's verdict: every scheduled message accounted for, and the summary.

The driving loop (deltabus_bench.runner) hands over what it observed (`RunState`); the
latency statistics come from deltabus_bench.analysis, the report files from
deltabus_bench.report.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_TABLE
from deltabus.delta.lake import Lake
from deltabus_bench.analysis import (
    SAMPLES_TABLE,
    analyse,
    build_samples,
    quarter_drift,
    recovery,
    samples_connection,
    write_samples,
)
from deltabus_bench.config import BenchConfig
from deltabus_bench.cost import cost_summary
from deltabus_bench.result_parts import Idle, Serving, ServingReplay, StageLatency
from deltabus_bench.results import DrainResult, Quarter, RunDetail, RunSummary, SoakResult
from deltabus_bench.run_state import RunState
from deltabus_bench.verdict import BEHIND, KEEPING_UP, Verdict, classify
from deltabus_bench.workload import ProducerSpec

log = logging.getLogger("deltabus_bench")


NO_INPUT_COMMIT = (
    "{n} message(s) without an input commit time: the input log had expired and compaction "
    "rewrote their files, so the first two stages leave them out (end-to-end latency is "
    "unaffected)"
)


def evaluate_run(
    cfg: BenchConfig, lake: Lake, state: RunState, inputs: pa.Table, seen: pa.Table
) -> RunDetail:
    """Account for every scheduled message and shape one run's detail (with its summary).

    Errors (lost, duplicated or unexpected messages, wrong timestamps, a shifted warm-up)
    make the command fail; notes explain what limits a figure.
    """
    samples, checks = build_samples(inputs, seen)
    uri = write_samples(lake, samples)
    con = samples_connection(lake)
    result = analyse(
        con,
        start_ms=state.start_ms,
        warmup_s=cfg.warmup,
        duration_s=cfg.duration,
        interval_s=cfg.interval_s,
    )
    # Expected messages from the schedule; lost = expected but never seen.
    expected = _expected(state.specs, state.start_ms)
    seen_ids = pl.from_arrow(samples.select(["message"]))
    missing = expected.join(seen_ids, on="message", how="anti")
    warm_end = state.start_ms + cfg.warmup * 1000
    messages = int(expected.filter(pl.col("sent_ms") >= warm_end).height)
    lost_after = missing.filter(pl.col("sent_ms") >= warm_end)
    lost_warmup = missing.height - lost_after.height
    errors = list(state.errors)
    errors += _accounting_errors(
        checks,
        result,
        expected=expected.height,
        messages=messages,
        lost=lost_after.height,
        lost_warmup=lost_warmup,
    )
    if checks["input_commit_unknown"]:
        state.notes.append(NO_INPUT_COMMIT.format(n=checks["input_commit_unknown"]))
    pct = result["percentiles"]
    verdict = classify(
        result["over_time"],
        cfg.warmup,
        pct["p99"],
        cfg.commit_interval if state.backbone == "delta" else None,
        unseen=int(lost_after.height),
    )
    summary = _run_summary(
        cfg, state, result, inputs, messages=messages, lost=int(lost_after.height), verdict=verdict
    )
    if state.served is not None:
        summary = summary.model_copy(update={"serving": _serving(cfg, state, samples, errors)})
    drain: DrainResult | None = None
    if state.drain is not None and state.drain.resumed_ms is not None:
        drain = _drain_detail(cfg, state, con)
    elif cfg.backlog_drain and state.backbone == "delta":
        errors.append("the backlog drain did not complete (the run ended first)")
    soak = _soak_detail(cfg, state, con, lake) if cfg.soak and state.backbone == "delta" else None
    detail = _run_detail(
        cfg,
        state,
        summary,
        lake_prefix=lake.settings.prefix,
        samples_table=uri,
        result=result,
        lost_warmup=lost_warmup,
        lost_examples=missing["message"].head(5).to_list(),
        checks=checks,
        verdict=verdict,
        errors=errors,
    ).model_copy(update={"drain": drain, "soak": soak})
    _log_run(state, summary, errors)
    return detail


def _run_summary(
    cfg: BenchConfig,
    state: RunState,
    result: dict[str, Any],
    inputs: pa.Table,
    *,
    messages: int,
    lost: int,
    verdict: Verdict,
) -> RunSummary:
    """A run's summary (a row of report.json's `runs`): its percentiles, stages, verdict,
    achieved rate and cost (with the idle pipeline's, when measured)."""
    pct = result["percentiles"]
    max_lag = max((float(r.get("max_lag_s", 0)) for r in state.producer_reports), default=0.0)
    idle = Idle.model_validate(state.idle) if state.idle else None
    return RunSummary(
        rate=state.rate,
        backbone=state.backbone,
        # The Kafka backbone's ETL is Pathway's (deltabus_bench.kafka.etl) unless
        # it is the Kafka Streams topology (deltabus_bench.kafka.streams_etl).
        etl=cfg.etl if state.backbone == "delta" or cfg.etl == "kafka-streams" else "pathway",
        samples=result["samples"],
        messages=messages,
        lost=lost,
        p50=pct["p50"],
        p75=pct["p75"],
        p85=pct["p85"],
        p95=pct["p95"],
        p99=pct["p99"],
        p99_9=pct["p99.9"],
        max=pct["max"],
        achieved_rate=_achieved_rate(inputs, state.start_ms),
        max_lag_s=round(max_lag, 3),
        verdict=verdict.verdict,
        fell_behind=verdict.verdict == BEHIND,
        stages={name: StageLatency(**s) for name, s in result["stages"].items()},
        cost=cost_summary(state.cpu, state.rate, state.requests, idle),
    )


def _achieved_rate(inputs: pa.Table, start_ms: float) -> float:
    """Messages per second the inputs took, from the schedule's start to their last commit."""
    last_commit = float(pc.max(inputs["input_commit_ms"]).as_py() or 0) if inputs.num_rows else 0.0
    span_s = (last_commit - start_ms) / 1000
    return round(inputs.num_rows / span_s, 1) if span_s > 0 else 0.0


def _run_detail(
    cfg: BenchConfig,
    state: RunState,
    summary: RunSummary,
    *,
    lake_prefix: str,
    samples_table: str,
    result: dict[str, Any],
    lost_warmup: int,
    lost_examples: list[str],
    checks: dict[str, Any],
    verdict: Verdict,
    errors: list[str],
) -> RunDetail:
    """A run's detail (runs/<backbone>-<rate>.json): its summary, configuration, the
    producers' and ETL's reports, the accounting and the series over time. The detail
    holds a copy of `errors`: the run's errors are complete before it is built."""
    return RunDetail(
        summary=summary,
        profile=cfg.profile if state.backbone == "delta" else "n/a (Kafka: per message)",
        store=cfg.store,
        lake_prefix=lake_prefix,
        samples_table=samples_table,
        schedule_start_ms=state.start_ms,
        warmup_s=cfg.warmup,
        duration_s=cfg.duration,
        producers=[vars(s) | {"total": s.total} for s in state.specs],
        producer_reports=state.producer_reports,
        producer_mode=cfg.producer_mode,
        partitions=cfg.partitions,
        partitioner=cfg.partitioner,
        etl_processes=cfg.etl_processes,
        etl_reports=state.etl_reports,
        cpu=state.cpu,
        timings=state.timings,
        samples_including_warmup=result["samples_including_warmup"],
        lost_during_warmup=lost_warmup,
        lost_examples=lost_examples,
        checks=checks,
        behind=verdict,
        errors=errors,
        notes=state.notes,
        over_time=result["over_time"],
        stages_over_time=result["stages_over_time"],
    )


def _accounting_errors(
    checks: dict[str, Any],
    result: dict[str, Any],
    *,
    expected: int,
    messages: int,
    lost: int,
    lost_warmup: int,
) -> list[str]:
    """What the accounting of messages found wrong: messages never seen, repeated,
    unexpected or mis-parsed, inputs that differ from the schedule, a shifted warm-up."""
    errors = []
    if lost or lost_warmup:
        errors.append(
            f"{lost + lost_warmup} message(s) produced but never seen within the grace period "
            f"({lost} after the warm-up, {lost_warmup} during it)"
        )
    for key in (
        "duplicate_rows_seen",
        "seen_but_not_produced",
        "parsed_timestamp_mismatches",
        "retractions_seen",
        "duplicate_inputs",
    ):
        if checks[key]:
            errors.append(f"{key.replace('_', ' ')}: {checks[key]}")
    if checks["produced_rows"] != expected:
        errors.append(
            f"the inputs hold {checks['produced_rows']} messages, the schedule {expected}"
        )
    if not result["first_sent_is_schedule_start"] and result["samples"]:
        errors.append("the first sample is not the first scheduled message (warm-up shifted)")
    if result["samples"] != messages - lost:
        errors.append(
            f"samples after warm-up {result['samples']} != messages {messages} - lost {lost}"
        )
    return errors


def _drain_detail(cfg: BenchConfig, state: RunState, con: Any) -> DrainResult:
    """A backlog drain: when the ETL went down, how long its restart took, and when p99
    was back to its level before the stop."""
    d = state.drain
    assert d is not None and d.resumed_ms is not None
    figures = recovery(
        con,
        down_ms=d.down_ms,
        resumed_ms=d.resumed_ms,
        warmup_end_ms=state.start_ms + cfg.warmup * 1000,
        threshold_s=cfg.recovery_threshold,
    )
    return DrainResult(
        signal=d.signal,
        restart_ready_s=d.restart_ready_s,
        down_at_s=round((d.down_ms - state.start_ms) / 1000, 2),
        **figures,
    )


def _soak_detail(cfg: BenchConfig, state: RunState, con: Any, lake: Lake) -> SoakResult:
    """A soak with maintenance: its passes, their errors and durations, the latency per
    quarter of the run, and the tables' sizes at the end."""
    passes = [m for m in state.maintenance if m.get("event") == "pass"]
    quarters = quarter_drift(con, state.start_ms, cfg.warmup, cfg.duration)
    return SoakResult(
        maintenance_passes=len(passes),
        maintenance_errors=[m for m in state.maintenance if m.get("event") == "error"],
        maintenance_at_s=[round((m["start_ms"] - state.start_ms) / 1000, 1) for m in passes],
        maintenance_duration_s=[round((m["end_ms"] - m["start_ms"]) / 1000, 2) for m in passes],
        quarters=[Quarter(**q) for q in quarters],
        tables=_table_sizes(lake),
    )


def _log_run(state: RunState, summary: RunSummary, errors: list[str]) -> None:
    """One line per error, and the run's figures."""
    for e in errors:
        log.error("%s at %s msg/s: %s", state.backbone, state.rate, e)
    log.info(
        "%s at %s msg/s: %d samples, p50 %.3f s, p99 %.3f s, max %.3f s, lost %d%s",
        state.backbone,
        f"{state.rate:,}",
        summary.samples,
        summary.p50 or 0,
        summary.p99 or 0,
        summary.max or 0,
        summary.lost,
        f", {summary.verdict.upper()}" if summary.verdict != KEEPING_UP else "",
    )


def _serving(cfg: BenchConfig, state: RunState, samples: pa.Table, errors: list[str]) -> Serving:
    """--serve: the serving stage, its verdict and its CPU (deltabus_bench.serving)."""
    from deltabus_bench.config import SERVER_CPU
    from deltabus_bench.serving import (
        SINK_CPU,
        SYSTEMS,
        serving_summary,
        unserved_is_loss,
    )

    assert state.served is not None and cfg.serve is not None
    out = serving_summary(
        samples,
        state.served,
        warmup_s=cfg.warmup,
        interval_s=cfg.interval_s,
        classify=lambda series, p99, unseen: classify(
            series, cfg.warmup, p99, cfg.commit_interval, unseen=unseen
        ),
        backend=cfg.serve,
    )
    refresh_ms = in_flight = None
    if cfg.serve == "opensearch":  # what shapes the stage: refresh interval, pipelining
        from deltabus.adapters.serving.opensearch_target import (
            DEFAULT_IN_FLIGHT,
            DEFAULT_REFRESH_INTERVAL_MS,
        )

        refresh_ms = cfg.serve_refresh_ms or DEFAULT_REFRESH_INTERVAL_MS
        in_flight = cfg.serve_in_flight or DEFAULT_IN_FLIGHT
    replay = state.serving_replay
    out = out.model_copy(
        update={
            "refresh_interval_ms": refresh_ms,
            "in_flight": in_flight,
            "raw_capacity": state.serving_raw,
            "cpu_pct_of_one_core": {
                k: state.cpu[k] for k in (SINK_CPU, SERVER_CPU[cfg.serve]) if k in state.cpu
            },
            "sink_report": state.serving_report,
            "replay": ServingReplay.model_validate(replay) if replay is not None else None,
        }
    )
    if out.not_served:
        sink = state.serving_report or {}
        at, newest = sink.get("version", -1), sink.get("unified_version", -1)
        if not unserved_is_loss(sink):  # a backlog, not a loss: the verdict says behind
            log.warning(
                "%s at %s msg/s: %d message(s) not yet in %s when the wait ended; the sink "
                "had applied unified version %d of %d",
                state.backbone,
                f"{state.rate:,}",
                out.not_served,
                SYSTEMS[cfg.serve],
                at,
                newest,
            )
        else:
            errors.append(
                f"{out.not_served} message(s) seen in timezone_unified but never in "
                f"{SYSTEMS[cfg.serve]}, whose sink applied every unified version it knew of"
            )
    return out


def _expected(specs: list[ProducerSpec], start_ms: float) -> pl.DataFrame:
    frames = []
    for s in specs:
        index = np.arange(s.total, dtype=np.int64)
        sent_us = np.round(index * (1_000_000.0 / s.rate))
        frames.append(
            pl.DataFrame({"i": index, "sent_ms": start_ms + sent_us / 1000}).select(
                message=pl.lit(f"{s.run_id}-") + pl.col("i").cast(pl.String),
                sent_ms=pl.col("sent_ms"),
            )
        )
    return pl.concat(frames) if frames else pl.DataFrame({"message": [], "sent_ms": []})


def _table_sizes(lake: Lake) -> dict[str, dict]:
    sizes = {}
    for table in (*INPUT_TABLES, UNIFIED_TABLE, SAMPLES_TABLE):
        if lake.exists(table):
            dt = lake.open(table)
            sizes[table] = {"version": dt.version(), "files": len(dt.file_uris())}
    return sizes
