"""Runs the benchmark: per rate and backbone, a fresh lake prefix (or broker), the ETL as
its own process, open-loop producers, a tailing consumer; then samples, report, plots.

Methodology (as OpenMessagingBenchmark): every message carries its scheduled send time;
the warm-up is discarded; the report counts exactly the samples taken, and a message
that was scheduled but never seen is a loss, reported (and the command fails).

A windowed soak (`--soak-minutes`) keeps no sample: the consumer hands its batches to
`deltabus_bench.soak_windows`, which aggregates them per window as they come, and the
run ends with windows.json/.md/.png (deltabus_bench.soak_report) instead of report.md.

Each backbone is a driver (deltabus_bench.drivers): `Bench.run_driver` starts
its pipeline, drives it with the one loop every backbone shares, and tears it down.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from deltabus.adapters.serving.settings import ServingSettings, load_serving_settings
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake
from deltabus_bench.config import BenchConfig
from deltabus_bench.cost import RequestMeter
from deltabus_bench.delta.driver import DeltaDriver
from deltabus_bench.drivers import (
    MAX_DRAIN_WAIT_FACTOR,
    Driver,
    DriverContext,
    Pipeline,
    json_lines,
    running_etls,
)
from deltabus_bench.environment import machine_description
from deltabus_bench.evaluate import evaluate_run
from deltabus_bench.kafka.driver import KafkaDriver
from deltabus_bench.progress import ProgressDisplay
from deltabus_bench.report import write_json, write_reports
from deltabus_bench.results import RunDetail
from deltabus_bench.run_state import RunState
from deltabus_bench.workload import ProducerHandle, ProducerSpec

log = logging.getLogger("deltabus_bench")

# The backbones `--backbones` names, each a driver (deltabus_bench.drivers).
DRIVERS: dict[str, Callable[[DriverContext, Lake, RunState], Driver]] = {
    "delta": DeltaDriver,
    "kafka": KafkaDriver,
}

START_DELAY_S = 0.5  # schedule origin this far after every producer reported ready


class Bench:
    def __init__(
        self,
        cfg: BenchConfig,
        settings: Settings,
        *,
        minio_pid: int | None = None,
        relay_pid: int | None = None,
        show_progress: bool = True,
        metrics_endpoint: str | None = None,
        proxy_pids: dict[str, int] | None = None,
        serving: ServingSettings | None = None,
    ) -> None:
        """`settings` is the lake every component uses (through the store profile's proxy,
        if any); `metrics_endpoint` the MinIO whose metrics count the requests and whose
        objects a windowed soak lists (default: `settings.minio_endpoint`); `proxy_pids`
        the store profile's proxies, sampled per window by a windowed soak; `serving` where
        `--serve` writes (default: the environment and ./.env). A
        `cfg.log_retention_s` overrides the settings' log retention for every table and
        process of the run; a run with maintenance keeps removed files in its tables' log
        state for the log retention (vacuum's when there is none), unless the settings give
        a deleted-file retention."""
        self.cfg = cfg
        if cfg.log_retention_s is not None:
            settings = settings.model_copy(update={"log_retention_s": cfg.log_retention_s})
        if cfg.maintenance and settings.deleted_file_retention_s is None:
            # No reader is served a version older than the log retention, and the soak's
            # vacuum is full (its retention is at least an hour): the removes need not stay
            # in the state any longer (docs/adr/0035).
            kept = settings.log_retention_s or cfg.vacuum_hours * 3600
            update = {"deleted_file_retention_s": min(kept, cfg.vacuum_hours * 3600)}
            settings = settings.model_copy(update=update)
        self.settings = settings
        self.serving = serving if serving is not None else load_serving_settings()
        self.metrics_endpoint = metrics_endpoint or settings.minio_endpoint
        self.proxy_pids = dict(proxy_pids or {})
        self.minio_pid = minio_pid
        self.relay_pid = relay_pid
        self.show_progress = show_progress
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.base_prefix = f"{settings.prefix}/bench/{stamp}-{uuid.uuid4().hex[:4]}"
        self.out = cfg.out
        self.work = self.out / "logs"
        self.machine = machine_description()
        # Object-store requests, read from MinIO's metrics (None on a local-directory lake).
        self.minio_requests = (
            RequestMeter(metrics_endpoint or settings.minio_endpoint)
            if settings.storage == "minio"
            else None
        )

    @property
    def bench_cpu_name(self) -> str:
        if self.cfg.producer_mode == "inline":
            return "bench (consumer + producers)"
        return "bench (consumer)"

    @property
    def context(self) -> DriverContext:
        """What the drivers read of this benchmark."""
        return DriverContext(
            cfg=self.cfg,
            settings=self.settings,
            serving=self.serving,
            work=self.work,
            bench_cpu_name=self.bench_cpu_name,
            minio_pid=self.minio_pid,
            relay_pid=self.relay_pid,
            proxy_pids=self.proxy_pids,
            minio_requests=self.minio_requests,
            specs=self.specs,
        )

    # -- the whole benchmark -----------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        (self.out / "runs").mkdir(exist_ok=True)
        log.info(
            "benchmark: rates %s, %g s (warm-up %g s), commit %s, store %s, backbones %s, lake %s",
            list(self.cfg.rates),
            self.cfg.duration,
            self.cfg.warmup,
            self.cfg.profile,
            self.cfg.store,
            "+".join(self.cfg.backbones),
            Lake(self.settings.with_prefix(self.base_prefix)).root,
        )
        if self.cfg.windowed:  # one rate, Delta: windows.json/.md/.png, no report.md
            from deltabus_bench.soak_report import write_soak_files

            lake, state = self._fresh_run("delta", self.cfg.rates[0])
            report = self._run_delta_windowed(lake, state)
            write_soak_files(self.out, report)
            return report
        details = []
        for rate in self.cfg.rates:
            for backbone in self.cfg.backbones:
                detail = self.run_one(backbone, rate)
                details.append(detail)
                write_json(self.out / "runs" / f"{detail.summary.key}.json", detail.to_dict())
        return write_reports(self.out, self.cfg, self.machine, details)

    def _fresh_run(self, backbone: str, rate: int) -> tuple[Lake, RunState]:
        """A run's own lake prefix and its state, empty."""
        prefix = f"{self.base_prefix}/{backbone}-{rate}"
        log.info("%s at %s msg/s: lake prefix %s", backbone, f"{rate:,}", prefix)
        return Lake(self.settings.with_prefix(prefix)), RunState(backbone=backbone, rate=rate)

    def run_one(self, backbone: str, rate: int) -> RunDetail:
        """One run of `backbone` at `rate` on a fresh lake prefix, accounted for."""
        lake, state = self._fresh_run(backbone, rate)
        inputs, seen = self.run_driver(DRIVERS[backbone](self.context, lake, state))
        return evaluate_run(self.cfg, lake, state, inputs, seen)

    def run_driver(self, driver: Driver) -> tuple[pa.Table, pa.Table]:
        """Start the driver's pipeline, drive it, tear it down: (produced, seen)."""
        try:
            pipeline = driver.start()
            self.drive(driver.state, pipeline)
            driver.finish(pipeline)
        finally:
            driver.stop()
        return driver.tables()

    def specs(self, backbone: str, rate: int, bootstrap: str = "") -> list[ProducerSpec]:
        k = self.cfg.producers
        tag = uuid.uuid4().hex[:6]
        return [
            ProducerSpec(
                backbone=backbone,
                rate=rate / k,
                duration=self.cfg.duration,
                commit_interval=self.cfg.commit_interval,
                seed=self.cfg.seed + i,
                run_id=f"b{tag}p{i}",
                bootstrap=bootstrap,
            )
            for i in range(k)
        ]

    def _run_delta_windowed(self, lake: Lake, state: RunState) -> dict[str, Any]:
        """A windowed soak: the Delta run with its consumer's batches aggregated per window
        as they come (nothing kept per message), maintenance passes mid-window, and the
        report so far rewritten at every window's end."""
        from deltabus_bench.soak_monitor import ObjectCounter
        from deltabus_bench.soak_report import build_soak_report, write_soak_files
        from deltabus_bench.soak_windows import SoakWindows

        cfg = self.cfg
        direct = self.settings
        if direct.storage == "minio":
            direct = direct.model_copy(update={"minio_endpoint": self.metrics_endpoint})
        objects = ObjectCounter(Lake(direct.with_prefix(lake.settings.prefix)))
        state.specs = self.specs("delta", state.rate)
        soak = SoakWindows(
            specs=state.specs,
            warmup_s=cfg.warmup,
            window_s=cfg.window_s,
            windows=cfg.windows,
            objects=objects,
            requests=(
                RequestMeter(self.metrics_endpoint) if self.settings.storage == "minio" else None
            ),
        )
        maintenance_log: list[Path] = []

        def report(final: bool) -> dict[str, Any]:
            events = json_lines(maintenance_log[0]) if maintenance_log else []
            return build_soak_report(
                cfg,
                soak,
                machine=self.machine,
                start_ms=state.start_ms,
                lake_prefix=lake.settings.prefix,
                log_retention_s=lake.settings.log_retention_s,
                events=events,
                run_errors=state.errors,
                notes=state.notes,
                whole_run_cpu=state.cpu or None,
                whole_run_requests=state.requests,
                final=final,
            )

        def progress(k: int) -> None:
            current = report(final=False)
            write_soak_files(self.out, current)
            w = current["windows"][-1]
            log.info(
                "window %d/%d: p50 %s s, p99 %s s, objects %s, RSS MB %s",
                k + 1,
                soak.n,
                w["p50_s"],
                w["p99_s"],
                (w["objects"] or {}).get("objects", "n/a"),
                ", ".join(f"{n} {v:.0f}" for n, v in w["rss_mb"].items()),
            )

        soak.monitor.on_window = progress
        self.run_driver(DeltaDriver(self.context, lake, state, soak, maintenance_log))
        return report(final=True)

    def _wait_for_consumer(
        self,
        state: RunState,
        pipeline: Pipeline,
        total: int,
        produce_end: float,
        show: Callable[[str], None],
    ) -> None:
        """Wait for the consumer: all `total` messages seen, or no progress for `grace` s,
        or the wait cap, or an ETL process gone."""
        cfg, consumer = self.cfg, pipeline.consumer
        cap = time.monotonic() + MAX_DRAIN_WAIT_FACTOR * cfg.duration + 60
        while consumer.inserted < total and consumer.error is None:
            if time.monotonic() - max(consumer.last_progress, produce_end) > cfg.grace:
                log.warning("no new rows for %g s: giving up waiting", cfg.grace)
                break
            if time.monotonic() > cap:
                log.warning("still missing rows after the wait cap: giving up")
                break
            if dead := [e for e in running_etls(pipeline.etls, state.drain) if not e.alive()]:
                state.errors.append(f"the ETL process died: {dead[0].stderr_tail(5)}")
                break
            show("draining")
            time.sleep(0.25)

    # -- the driving loop, common to every backbone ------------------------------------

    def drive(self, state: RunState, pipeline: Pipeline) -> None:
        """Start the producers on one schedule, show progress until they end, then wait
        for the consumer. `pipeline.begin(start_ms)` is called with the schedule origin
        (epoch ms) before any producer gets it."""
        cfg = self.cfg
        handles, consumer, stats, cpu = (
            pipeline.handles,
            pipeline.consumer,
            pipeline.stats,
            pipeline.cpu,
        )
        requests, etls, drain = pipeline.requests, pipeline.etls, pipeline.drain
        total = sum(s.total for s in state.specs)
        start_us = int((time.time() + START_DELAY_S) * 1_000_000)
        state.start_ms = start_us / 1000
        stats.warmup_end_ms = state.start_ms + cfg.warmup * 1000
        if pipeline.begin is not None:
            pipeline.begin(state.start_ms)
        for h in handles:
            h.start(start_us)
        started = False
        with ProgressDisplay(enabled=self.show_progress) as display:

            def show(phase: str) -> None:
                elapsed = max(0.0, time.time() - start_us / 1e6)
                produced = sum(int(h.progress.get("messages", 0)) for h in handles)
                snap = stats.snapshot()
                display.update(
                    {
                        "backbone": state.backbone,
                        "rate": state.rate,
                        "phase": phase,
                        "elapsed": elapsed,
                        "duration": cfg.duration,
                        "produced": produced,
                        "total": total,
                        "achieved_rate": produced / elapsed if elapsed > 0.5 else 0.0,
                        "producer_lag_s": max(float(h.progress.get("lag_s", 0)) for h in handles),
                        "seen": consumer.inserted,
                        **snap,
                    }
                )

            while not all(h.done() for h in handles):
                now = time.time()
                if not started and now * 1e6 >= start_us:
                    cpu.start()
                    if requests:
                        requests.start()
                    started = True
                if drain is not None:
                    drain(now - start_us / 1e6)
                if dead := [e for e in running_etls(etls, state.drain) if not e.alive()]:
                    state.errors.append(f"the ETL process died: {dead[0].stderr_tail(5)}")
                    break
                if consumer.error is not None:
                    break
                show("producing")
                time.sleep(0.25)
            if not started:
                cpu.start()
                if requests:
                    requests.start()
            cpu.stop()
            state.cpu = cpu.report()
            if requests:
                requests.stop()
                state.requests = requests.per_second()
            state.timings["produce_end_ms"] = time.time() * 1000
            produce_end = time.monotonic()
            _collect_producers(state, handles)
            self._wait_for_consumer(state, pipeline, total, produce_end, show)
            show("done")
        state.timings["consumer_done_after_produce_s"] = round(
            time.time() - state.timings["produce_end_ms"] / 1000, 2
        )


def _collect_producers(state: RunState, handles: list[ProducerHandle]) -> None:
    """Wait for every producer's end; record its report, its CPU and its failure."""
    for h in handles:
        h.wait(30)
        if h.error:
            state.errors.append(f"producer {h.spec.run_id} failed: {h.error}")
        if h.report:
            state.producer_reports.append(h.report)
            if "cpu_s" in h.report and h.report.get("elapsed_s"):
                state.cpu[f"producer {h.spec.run_id}"] = round(
                    100 * h.report["cpu_s"] / h.report["elapsed_s"], 1
                )
