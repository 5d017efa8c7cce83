"""The Delta backbone: input tables, the ETL (deltabus' or Spark's) as its own processes,
a consumer tailing the unified table, and with `--serve` a serving sink; with a soak,
the maintenance loop and per-window aggregation instead of per-message samples."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltabus.apps.timezones.contracts import INPUT_SCHEMA, UNIFIED_SCHEMA
from deltabus.apps.timezones.etl.command import etl_command
from deltabus.apps.timezones.layout import ensure_layout
from deltabus.core.processes import ChildProcess, child_env
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table
from deltabus_bench.analysis import delta_inputs
from deltabus_bench.consumer import LiveStats
from deltabus_bench.delta.consumer import DeltaUnifiedConsumer, PartitionedConsumer
from deltabus_bench.drivers import (
    AFTER_IDLE_RUN,
    MAX_DRAIN_WAIT_FACTOR,
    DriverContext,
    Pipeline,
    json_lines,
    running_etls,
)
from deltabus_bench.environment import CpuMeter
from deltabus_bench.idle import first_after_idle, measure_idle
from deltabus_bench.run_state import Drain, RunState
from deltabus_bench.workload import ProducerHandle

if TYPE_CHECKING:
    from deltabus_bench.serving import ServingRun

log = logging.getLogger("deltabus_bench")

SPARK_START_S = 600  # --etl spark: its JVM, session and first micro-batch, on a busy machine


class DeltaDriver:
    """One Delta run (deltabus_bench.drivers). With `soak` (a `SoakWindows`),
    the consumer's batches go to it, the maintenance loop starts with the schedule (its
    passes half an interval into each window), its stdout path is appended to
    `maintenance_log`, and `tables` returns no inputs: nothing was kept per message."""

    def __init__(
        self,
        context: DriverContext,
        lake: Lake,
        state: RunState,
        soak: Any = None,
        maintenance_log: list[Path] | None = None,
    ) -> None:
        self.context = context
        self.cfg = context.cfg
        self.lake = lake
        self.state = state
        self.soak = soak
        self.maintenance_log = maintenance_log
        self.tag = f"delta-{state.rate}"
        self.env = child_env(lake.settings)
        self.ready = context.work / f"{self.tag}.etl-ready"
        self.etls: list[ChildProcess] = []
        self.handles: list[ProducerHandle] = []
        self.consumer: DeltaUnifiedConsumer | PartitionedConsumer | None = None
        self.maint: ChildProcess | None = None
        self.serving: Any = None
        self.cpu = CpuMeter()

    # -- the driver protocol ------------------------------------------------------------

    def start(self) -> Pipeline:
        cfg, lake, state, cpu = self.cfg, self.lake, self.state, self.cpu
        # Recorded before anyone writes.
        layout = ensure_layout(lake, cfg.partitions, cfg.partitioner)
        for table in layout.input_tables:
            ensure_table(lake, table, INPUT_SCHEMA)
        first_versions = {
            t: ensure_table(lake, t, UNIFIED_SCHEMA).version() + 1 for t in layout.unified_tables
        }
        etl = self._etl(f"{self.tag}-etl", self.ready)
        self.etls.append(etl)
        cpu.watch("etl", etl.pid, tree=cfg.etl == "spark")  # Spark: the driver and its JVM
        # More ETL processes, each owning its share of the partitions (a consumer group).
        more_ready = []
        for j in range(1, cfg.etl_processes):
            extra_ready = self.context.work / f"{self.tag}.etl-{j}-ready"
            self.etls.append(self._etl(f"{self.tag}-etl-{j}", extra_ready, j))
            more_ready.append(extra_ready)
            cpu.watch(f"etl {j}", self.etls[-1].pid)
        cpu.watch("minio", self.context.minio_pid)
        cpu.watch("notify relay", self.context.relay_pid)  # with --notify only (None: unwatched)
        cpu.watch(self.context.bench_cpu_name, os.getpid())
        if self.soak is None:
            state.specs = self.context.specs("delta", state.rate)
        stats = LiveStats()
        sink = self.soak.latency.add if self.soak is not None else None
        poll_s = cfg.consumer_poll_ms / 1000
        if layout.partitions == 1:
            self.consumer = DeltaUnifiedConsumer(lake, poll_s, stats, sink=sink)
        else:
            self.consumer = PartitionedConsumer(
                lake, poll_s, stats, layout.unified_tables, sink=sink
            )
            self.consumer.next_versions = first_versions
        if cfg.serve:  # the serving sink (PostgreSQL or OpenSearch) as one more stage
            self.serving = serving_run(
                cfg.serve,
                self.context.serving,
                self.context.work,
                self.tag,
                poll_s,
                cfg.serve_refresh_ms,
                cfg.serve_in_flight,
            )
        self.handles = [
            ProducerHandle(s, cfg.producer_mode, self.env, self.context.work, lake)
            for s in state.specs
        ]
        t0 = time.monotonic()
        etl.wait_file(self.ready, timeout=SPARK_START_S if cfg.etl == "spark" else 180)
        for extra, extra_ready in zip(self.etls[1:], more_ready, strict=True):
            extra.wait_file(extra_ready)
        state.timings["etl_ready_s"] = round(time.monotonic() - t0, 2)
        for h in self.handles:
            h.wait_ready()
        if isinstance(self.consumer, DeltaUnifiedConsumer):
            self.consumer.next_version = first_versions[layout.unified_tables[0]]
        self.consumer.start()
        self.consumer.ready.wait(60)
        if self.serving is not None:
            self.serving.start(lake.settings.prefix, self.env, cpu)
        if cfg.maintenance and self.soak is None:
            self.maint = self._maintenance()
            cpu.watch("maintenance", self.maint.pid, tree=True)  # a process per pass
        return Pipeline(
            handles=self.handles,
            consumer=self.consumer,
            stats=stats,
            cpu=cpu,
            etls=self.etls,
            drain=self._drain_step if cfg.backlog_drain else None,
            begin=self._begin_soak if self.soak is not None else None,
            requests=self.context.minio_requests,
        )

    def finish(self, pipeline: Pipeline) -> None:
        cfg = self.cfg
        if self.serving is not None:
            total = sum(s.total for s in self.state.specs)
            self.serving.wait(total, cfg.grace, MAX_DRAIN_WAIT_FACTOR * cfg.duration + 60)
        running = running_etls(self.etls, self.state.drain)
        if cfg.idle_s > 0 and all(e.alive() for e in running):
            self.state.idle = measure_idle(self.cpu.pids, cfg.idle_s, self.context.minio_requests)
            after = first_after_idle(self.lake, self.consumer, cfg.commit_interval)
            self.state.idle.update(after or {})

    def stop(self) -> None:
        state = self.state
        if self.soak is not None:  # the last window's figures, before anything stops
            ended = bool(self.handles) and all(h.done() for h in self.handles)
            self.soak.finish(aborted=not ended or bool(state.errors))
        for h in self.handles:
            h.kill()
        for e in self.etls:
            rc = e.stop()
            report = e.stdout_json()
            if report:
                state.etl_reports.append(report)
            if rc not in (0, None):
                state.errors.append(
                    f"ETL process {e.name} exited with status {rc}: {e.stderr_tail(5)}"
                )
        if self.consumer is not None:
            self.consumer.stop()
        if self.maint is not None:
            self.maint.stop()
            state.maintenance = json_lines(self.maint.stdout_path)
        if self.serving is not None:
            self.serving.stop(replay=self.cfg.serve_replay)
            state.errors.extend(self.serving.errors)
            state.served, state.serving_report = self.serving.served(), self.serving.report
            state.serving_replay = self.serving.replay_report
            state.serving_raw = self.serving.raw_capacity
        if self.consumer is not None and self.consumer.error is not None:
            state.errors.append(f"consumer failed: {self.consumer.error}")

    def tables(self) -> tuple[pa.Table, pa.Table]:
        assert self.consumer is not None
        if self.soak is not None:  # nothing kept per message: the windows have it all
            return INPUT_SCHEMA.empty_table(), self.consumer.table()
        return without_after_idle(delta_inputs(self.lake)), without_after_idle(
            self.consumer.table()
        )

    # -- stages ---------------------------------------------------------------------------

    def _etl(self, name: str, ready: Path, process: int = 0) -> ChildProcess:
        ready.unlink(missing_ok=True)
        if self.cfg.etl == "spark":
            return self._spark_etl(name, ready)
        n = self.cfg.etl_processes
        command = etl_command(
            "continuous",
            commit_interval=self.cfg.commit_interval,
            poll_interval=None if self.cfg.etl_poll_ms is None else self.cfg.etl_poll_ms / 1000,
            ready_file=ready,
            prefix=self.lake.settings.prefix,
            **({"process": process, "processes": n} if n > 1 else {}),
        )
        return ChildProcess(name, command, self.env, self.context.work).start()

    def _spark_etl(self, name: str, ready: Path) -> ChildProcess:
        """The Spark Structured Streaming ETL (bench.spark_etl) as its own process,
        its query's checkpoint a fresh directory beside the logs."""
        checkpoint = self.context.work / f"{name}.spark-checkpoint"
        shutil.rmtree(checkpoint, ignore_errors=True)  # a stale one names other tables
        trigger_ms = round(self.cfg.commit_interval * 1000)
        command = [sys.executable, "-m", "deltabus_bench.delta.spark_etl"]
        command += ["--trigger-ms", str(trigger_ms), "--checkpoint", str(checkpoint)]
        command += ["--ready-file", str(ready)]
        return ChildProcess(name, command, self.env, self.context.work).start()

    def _maintenance(self, first_at: float | None = None) -> ChildProcess:
        """The maintenance loop (deltabus_bench.delta.maintenance_loop) as its own process,
        each pass a child of it: every `--maintenance-interval` s, from `first_at` (epoch s)
        when given."""
        cfg = self.cfg
        args = [
            sys.executable,
            "-m",
            "deltabus_bench.delta.maintenance_loop",
            "--interval",
            str(cfg.maintenance_interval),
            "--retention-hours",
            str(cfg.vacuum_hours),
        ]
        if first_at is not None:
            args += ["--first-at", f"{first_at:.3f}"]
        if cfg.retention_s is not None:
            args += ["--retention-s", str(cfg.retention_s)]
        return ChildProcess(f"{self.tag}-maintenance", args, self.env, self.context.work).start()

    def _begin_soak(self, start_ms: float) -> None:
        """A soak's start: the maintenance loop and the windows, on the schedule origin."""
        cfg, soak = self.cfg, self.soak
        for name, pid in self.cpu.pids.items():
            soak.monitor.watch(name, pid, tree=name in self.cpu.trees)
        for h in self.handles:
            soak.monitor.watch(f"producer {h.spec.run_id}", h.pid)
        for name, pid in self.context.proxy_pids.items():  # the network's stand-in
            soak.monitor.watch(name, pid)
            soak.not_judged.add(name)
        first = start_ms / 1000 + cfg.warmup + cfg.maintenance_interval / 2
        self.maint = self._maintenance(first_at=first)
        if self.maintenance_log is not None:
            self.maintenance_log.append(self.maint.stdout_path)
        self.cpu.watch("maintenance", self.maint.pid, tree=True)  # a process per pass
        soak.monitor.watch("maintenance", self.maint.pid, tree=True)
        soak.begin(start_ms)

    def _drain_step(self, elapsed: float) -> None:
        """Backlog drain: take the ETL (process 0 of several) down at drain_at for
        backlog_drain s, then resume it; the other processes go on meanwhile."""
        cfg, state, etls = self.cfg, self.state, self.etls
        d = state.drain
        if d is None and elapsed >= cfg.drain_at:
            etl = etls[0]
            state.drain = d = Drain(signal=cfg.drain_signal, down_ms=time.time() * 1000)
            log.info("backlog drain: ETL down (%s) for %g s", cfg.drain_signal, cfg.backlog_drain)
            if cfg.drain_signal == "stop":
                etl.signal(signal.SIGSTOP)
            else:
                self.cpu.sample("etl")
                etl.stop()
            return
        if d is not None and d.resumed_ms is None and not d.resuming:
            if time.time() * 1000 - d.down_ms < cfg.backlog_drain * 1000:
                return
            d.resuming = True
            if cfg.drain_signal == "stop":
                etls[0].signal(signal.SIGCONT)
            else:
                restart_at = time.monotonic()
                etl = self._etl(f"{self.tag}-etl-restarted", self.ready, 0)
                etls.append(etl)
                self.cpu.watch("etl (restarted)", etl.pid)
                etl.wait_file(self.ready)
                d.restart_ready_s = round(time.monotonic() - restart_at, 2)
            d.resumed_ms = time.time() * 1000
            log.info("backlog drain: ETL resumed")


def without_after_idle(table: pa.Table) -> pa.Table:
    """The run's own messages: the after-idle probe is measured apart (`first_after_idle_s`)."""
    import pyarrow.compute as pc

    if table.num_rows == 0 or "message" not in table.column_names:
        return table
    probe = pc.starts_with(table.column("message").cast(pa.string()), f"{AFTER_IDLE_RUN}-")
    return table.filter(pc.invert(probe))


def serving_run(
    backend: str,
    settings: Any,
    work: Path,
    tag: str,
    poll_s: float,
    refresh_interval_ms: int | None = None,
    in_flight: int | None = None,
) -> ServingRun:
    """The serving stage of one run for `backend` (one of SYSTEMS); the refresh
    interval and the batches in flight apply to OpenSearch only (None: the sink's
    default)."""
    from deltabus_bench.serving_opensearch import OpenSearchServingRun
    from deltabus_bench.serving_postgres import PostgresServingRun

    if backend == "opensearch":
        return OpenSearchServingRun(settings, work, tag, poll_s, refresh_interval_ms, in_flight)
    if backend != "postgres":
        raise ValueError(f"no serving backend {backend!r}")
    return PostgresServingRun(settings, work, tag, poll_s)
