"""Runs the benchmark: per rate and backbone, a fresh lake prefix (or broker), the ETL as
its own process, open-loop producers, a tailing consumer; then samples, report, plots.

Methodology (as OpenMessagingBenchmark): every message carries its scheduled send time;
the warm-up is discarded; the report counts exactly the samples taken, and a message
that was scheduled but never seen is a loss, reported (and the command fails).

A windowed soak (`--soak-minutes`) keeps no sample: the consumer hands its batches to
`deltabus.adapters.bench.soak_windows`, which aggregates them per window as they come, and the
run ends with windows.json/.md/.png (deltabus.adapters.bench.soak_report) instead of report.md.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltabus.adapters.bench.analysis import (
    delta_inputs,
)
from deltabus.adapters.bench.config import BenchConfig
from deltabus.adapters.bench.consumer import (
    DeltaUnifiedConsumer,
    KafkaUnifiedConsumer,
    LiveStats,
    PartitionedConsumer,
)
from deltabus.adapters.bench.cost import RequestMeter
from deltabus.adapters.bench.environment import CpuMeter, machine_description
from deltabus.adapters.bench.evaluate import Drain, RunState, evaluate_run
from deltabus.adapters.bench.progress import ProgressDisplay
from deltabus.adapters.bench.report import write_json, write_reports
from deltabus.adapters.bench.workload import ProducerHandle, ProducerSpec
from deltabus.apps.timezones.layout import ensure_layout
from deltabus.core.processes import ChildProcess, child_env, etl_command
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake

log = logging.getLogger("deltabus.adapters.bench")

START_DELAY_S = 0.5  # schedule origin this far after every producer reported ready
MAX_DRAIN_WAIT_FACTOR = 2.0  # after the producers end, wait at most this x duration + 60 s
SPARK_START_S = 600  # --etl spark: its JVM, session and first micro-batch, on a busy machine


# The probe sent after the idle window: a run id of its own, left out of the analysis.
AFTER_IDLE_RUN = "after-idle"
IDLE_WINDOW_S = 60.0  # the idle cost is also reported per window of this length
AFTER_IDLE_COUNT = 10


def _without_after_idle(table: pa.Table) -> pa.Table:
    """The run's own messages: the after-idle probe is measured apart (`first_after_idle_s`)."""
    import pyarrow.compute as pc

    if table.num_rows == 0 or "message" not in table.column_names:
        return table
    probe = pc.starts_with(table.column("message").cast(pa.string()), f"{AFTER_IDLE_RUN}-")
    return table.filter(pc.invert(probe))


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
    ) -> None:
        """`settings` is the lake every component uses (through the store profile's proxy,
        if any); `metrics_endpoint` the MinIO whose metrics count the requests and whose
        objects a windowed soak lists (default: `settings.minio_endpoint`); `proxy_pids`
        the store profile's proxies, sampled per window by a windowed soak. A
        `cfg.log_retention_s` overrides the settings' log retention for every table and
        process of the run; a run with maintenance keeps removed files in its tables' log
        state as long as vacuum's retention, unless the settings give a retention."""
        self.cfg = cfg
        if cfg.log_retention_s is not None:
            settings = settings.model_copy(update={"log_retention_s": cfg.log_retention_s})
        if cfg.maintenance and settings.deleted_file_retention_s is None:
            # Removed files leave the log state when vacuum may delete them (docs/adr/0035).
            update = {"deleted_file_retention_s": cfg.vacuum_hours * 3600}
            settings = settings.model_copy(update=update)
        self.settings = settings
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
    def _bench_cpu_name(self) -> str:
        if self.cfg.producer_mode == "inline":
            return "bench (consumer + producers)"
        return "bench (consumer)"

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
            from deltabus.adapters.bench.soak_report import write_soak_files

            report, _ = self.run_one("delta", self.cfg.rates[0])
            write_soak_files(self.out, report)
            return report
        runs, details = [], []
        for rate in self.cfg.rates:
            for backbone in self.cfg.backbones:
                summary, detail = self.run_one(backbone, rate)
                runs.append(summary)
                details.append(detail)
                write_json(self.out / "runs" / f"{backbone}-{rate}.json", detail)
        return write_reports(self.out, self.cfg, self.machine, runs, details)

    def run_one(self, backbone: str, rate: int) -> tuple[dict, dict]:
        prefix = f"{self.base_prefix}/{backbone}-{rate}"
        lake = Lake(self.settings.with_prefix(prefix))
        state = RunState(backbone=backbone, rate=rate)
        log.info("%s at %s msg/s: lake prefix %s", backbone, f"{rate:,}", prefix)
        if backbone == "kafka":
            inputs, seen = self._run_kafka(lake, state)
        elif self.cfg.windowed:
            report = self._run_delta_windowed(lake, state)
            return report, report
        else:
            inputs, seen = self._run_delta(lake, state)
        return evaluate_run(self.cfg, lake, state, inputs, seen)

    # -- Delta ----------------------------------------------------------------------------

    def _specs(self, backbone: str, rate: int, bootstrap: str = "") -> list[ProducerSpec]:
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

    def _etl(
        self, prefix: str, env: dict, name: str, ready: Path, process: int = 0
    ) -> ChildProcess:
        ready.unlink(missing_ok=True)
        if self.cfg.etl == "spark":
            return self._spark_etl(env, name, ready)
        n = self.cfg.etl_processes
        command = etl_command(
            "continuous",
            commit_interval=self.cfg.commit_interval,
            poll_interval=None if self.cfg.etl_poll_ms is None else self.cfg.etl_poll_ms / 1000,
            ready_file=ready,
            prefix=prefix,
            **({"process": process, "processes": n} if n > 1 else {}),
        )
        return ChildProcess(name, command, env, self.work).start()

    def _spark_etl(self, env: dict, name: str, ready: Path) -> ChildProcess:
        """The Spark Structured Streaming ETL (bench.spark_etl) as its own process,
        its query's checkpoint a fresh directory beside the logs."""
        checkpoint = self.work / f"{name}.spark-checkpoint"
        shutil.rmtree(checkpoint, ignore_errors=True)  # a stale one names other tables
        trigger_ms = round(self.cfg.commit_interval * 1000)
        command = [sys.executable, "-m", "deltabus.adapters.bench.spark_etl"]
        command += ["--trigger-ms", str(trigger_ms), "--checkpoint", str(checkpoint)]
        command += ["--ready-file", str(ready)]
        return ChildProcess(name, command, env, self.work).start()

    def _run_delta_windowed(self, lake: Lake, state: RunState) -> dict[str, Any]:
        """A windowed soak: the Delta run with its consumer's batches aggregated per window
        as they come (nothing kept per message), maintenance passes mid-window, and the
        report so far rewritten at every window's end."""
        from deltabus.adapters.bench.soak_report import build_soak_report, write_soak_files
        from deltabus.adapters.bench.soak_windows import ObjectCounter, SoakWindows

        cfg = self.cfg
        direct = self.settings
        if direct.storage == "minio":
            direct = direct.model_copy(update={"minio_endpoint": self.metrics_endpoint})
        objects = ObjectCounter(Lake(direct.with_prefix(lake.settings.prefix)))
        state.specs = self._specs("delta", state.rate)
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
            events = _json_lines(maintenance_log[0]) if maintenance_log else []
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
        self._run_delta(lake, state, soak=soak, maintenance_log=maintenance_log)
        return report(final=True)

    def _run_delta(
        self,
        lake: Lake,
        state: RunState,
        soak: Any = None,
        maintenance_log: list[Path] | None = None,
    ) -> tuple[pa.Table, pa.Table]:
        """One Delta run. With `soak` (a `SoakWindows`), the consumer's batches go to it,
        the maintenance loop starts with the schedule (its passes half an interval into
        each window), its stdout path is appended to `maintenance_log`, and the returned
        tables are empty: nothing was kept per message."""
        from deltabus.apps.timezones.contracts import INPUT_SCHEMA, UNIFIED_SCHEMA
        from deltabus.delta.tables import ensure_table

        cfg = self.cfg
        tag = f"delta-{state.rate}"
        # Recorded before anyone writes.
        layout = ensure_layout(lake, cfg.partitions, cfg.partitioner)
        for table in layout.input_tables:
            ensure_table(lake, table, INPUT_SCHEMA)
        first_versions = {
            t: ensure_table(lake, t, UNIFIED_SCHEMA).version() + 1 for t in layout.unified_tables
        }
        first_version = first_versions[layout.unified_tables[0]]
        env = child_env(lake.settings)
        ready = self.work / f"{tag}.etl-ready"
        etl = self._etl(lake.settings.prefix, env, f"{tag}-etl", ready)
        cpu = CpuMeter()
        cpu.watch("etl", etl.pid, tree=cfg.etl == "spark")  # Spark: the driver and its JVM
        # More ETL processes, each owning its share of the partitions (a consumer group).
        more_etls = []
        for j in range(1, cfg.etl_processes):
            extra_ready = self.work / f"{tag}.etl-{j}-ready"
            more_etls.append(
                (
                    self._etl(lake.settings.prefix, env, f"{tag}-etl-{j}", extra_ready, j),
                    extra_ready,
                )
            )
            cpu.watch(f"etl {j}", more_etls[-1][0].pid)
        cpu.watch("minio", self.minio_pid)
        cpu.watch("notify relay", self.relay_pid)  # with --notify only (None: not watched)
        cpu.watch(self._bench_cpu_name, os.getpid())
        if soak is None:
            state.specs = self._specs("delta", state.rate)
        handles: list[ProducerHandle] = []
        maint: ChildProcess | None = None
        stats = LiveStats()
        sink = soak.latency.add if soak is not None else None
        consumer: DeltaUnifiedConsumer | PartitionedConsumer
        if layout.partitions == 1:
            consumer = DeltaUnifiedConsumer(lake, cfg.consumer_poll_ms / 1000, stats, sink=sink)
        else:
            consumer = PartitionedConsumer(
                lake, cfg.consumer_poll_ms / 1000, stats, layout.unified_tables, sink=sink
            )
            consumer.next_versions = first_versions
        etls = [etl, *(e for e, _ in more_etls)]
        serving = None
        if cfg.serve:  # the serving sink (PostgreSQL or OpenSearch) as one more stage
            from deltabus.adapters.bench.serving import serving_run

            serving = serving_run(
                cfg.serve,
                self.settings,
                self.work,
                tag,
                cfg.consumer_poll_ms / 1000,
                cfg.serve_refresh_ms,
            )
        try:
            handles = [
                ProducerHandle(s, cfg.producer_mode, env, self.work, lake) for s in state.specs
            ]
            t0 = time.monotonic()
            etl.wait_file(ready, timeout=SPARK_START_S if cfg.etl == "spark" else 180)
            for extra, extra_ready in more_etls:
                extra.wait_file(extra_ready)
            state.timings["etl_ready_s"] = round(time.monotonic() - t0, 2)
            for h in handles:
                h.wait_ready()
            if isinstance(consumer, DeltaUnifiedConsumer):
                consumer.next_version = first_version
            consumer.start()
            consumer.ready.wait(60)
            if serving is not None:
                serving.start(lake.settings.prefix, env, cpu)
            if cfg.maintenance and soak is None:
                maint = self._maintenance(tag, env)
                cpu.watch("maintenance", maint.pid)
            begin = None
            if soak is not None:
                for name, pid in cpu.pids.items():
                    soak.monitor.watch(name, pid, tree=name in cpu.trees)
                for h in handles:
                    soak.monitor.watch(f"producer {h.spec.run_id}", h.pid)
                for name, pid in self.proxy_pids.items():  # the network's stand-in
                    soak.monitor.watch(name, pid)
                    soak.not_judged.add(name)

                def begin(start_ms: float) -> None:
                    nonlocal maint
                    first = start_ms / 1000 + cfg.warmup + cfg.maintenance_interval / 2
                    maint = self._maintenance(tag, env, first_at=first)
                    if maintenance_log is not None:
                        maintenance_log.append(maint.stdout_path)
                    cpu.watch("maintenance", maint.pid)
                    soak.monitor.watch("maintenance", maint.pid)
                    soak.begin(start_ms)

            def drain(elapsed: float) -> None:
                self._drain_step(elapsed, state, etls, lake, env, cpu, tag, ready)

            self._drive(
                state,
                handles,
                consumer,
                stats,
                cpu,
                etls,
                drain if cfg.backlog_drain else None,
                begin=begin,
            )
            if serving is not None:
                total = sum(s.total for s in state.specs)
                serving.wait(total, cfg.grace, MAX_DRAIN_WAIT_FACTOR * cfg.duration + 60)
            running = _running_etls(etls, state.drain)
            if cfg.idle_s > 0 and all(e.alive() for e in running):
                state.idle = self._measure_idle(cpu.pids, cfg.idle_s)
                state.idle.update(self._first_after_idle(lake, consumer) or {})
        finally:
            if soak is not None:  # the last window's figures, before anything stops
                ended = bool(handles) and all(h.done() for h in handles)
                soak.finish(aborted=not ended or bool(state.errors))
            for h in handles:
                h.kill()
            for e in etls:
                rc = e.stop()
                report = e.stdout_json()
                if report:
                    state.etl_reports.append(report)
                if rc not in (0, None):
                    state.errors.append(
                        f"ETL process {e.name} exited with status {rc}: {e.stderr_tail(5)}"
                    )
            consumer.stop()
            if maint is not None:
                maint.stop()
                state.maintenance = _json_lines(maint.stdout_path)
            if serving is not None:
                serving.stop(replay=cfg.serve_replay)
                state.errors.extend(serving.errors)
                state.served, state.serving_report = serving.served(), serving.report
                state.serving_replay = serving.replay_report
        if consumer.error is not None:
            state.errors.append(f"consumer failed: {consumer.error}")
        if soak is not None:  # nothing kept per message: the windows have it all
            return INPUT_SCHEMA.empty_table(), consumer.table()
        return _without_after_idle(delta_inputs(lake)), _without_after_idle(consumer.table())

    def _maintenance(self, tag: str, env: dict, first_at: float | None = None) -> ChildProcess:
        """The maintenance loop (deltabus.adapters.bench.maintenance_loop) as its own process: every
        `--maintenance-interval` s, from `first_at` (epoch s) when given."""
        cfg = self.cfg
        args = [
            sys.executable,
            "-m",
            "deltabus.adapters.bench.maintenance_loop",
            "--interval",
            str(cfg.maintenance_interval),
            "--retention-hours",
            str(cfg.vacuum_hours),
        ]
        if first_at is not None:
            args += ["--first-at", f"{first_at:.3f}"]
        return ChildProcess(f"{tag}-maintenance", args, env, self.work).start()

    def _drain_step(
        self,
        elapsed: float,
        state: RunState,
        etls: list[ChildProcess],
        lake: Lake,
        env: dict,
        cpu: CpuMeter,
        tag: str,
        ready: Path,
    ) -> None:
        """Backlog drain: take the ETL (process 0 of several) down at drain_at for
        backlog_drain s, then resume it; the other processes go on meanwhile."""
        cfg = self.cfg
        d = state.drain
        if d is None and elapsed >= cfg.drain_at:
            etl = etls[0]
            state.drain = d = Drain(signal=cfg.drain_signal, down_ms=time.time() * 1000)
            log.info("backlog drain: ETL down (%s) for %g s", cfg.drain_signal, cfg.backlog_drain)
            if cfg.drain_signal == "stop":
                etl.signal(signal.SIGSTOP)
            else:
                cpu.sample("etl")
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
                etl = self._etl(lake.settings.prefix, env, f"{tag}-etl-restarted", ready, 0)
                etls.append(etl)
                cpu.watch("etl (restarted)", etl.pid)
                etl.wait_file(ready)
                d.restart_ready_s = round(time.monotonic() - restart_at, 2)
            d.resumed_ms = time.time() * 1000
            log.info("backlog drain: ETL resumed")

    # -- Kafka ----------------------------------------------------------------------------

    def _run_kafka(self, lake: Lake, state: RunState) -> tuple[pa.Table, pa.Table]:
        from deltabus.adapters.bench.kafka_broker import KafkaBroker
        from deltabus.adapters.bench.kafka_etl import INPUT_TOPICS, OUTPUT_TOPIC

        cfg = self.cfg
        tag = f"kafka-{state.rate}"
        # The broker's data is scratch (removed after the run); its log is kept in logs/.
        broker = KafkaBroker(Path(tempfile.mkdtemp(prefix=f"deltabus-bench-{tag}-")))
        env = child_env(lake.settings)
        cpu = CpuMeter()
        stats = LiveStats()
        handles: list[ProducerHandle] = []
        etl: ChildProcess | None = None
        consumer: KafkaUnifiedConsumer | None = None
        try:
            t0 = time.monotonic()
            broker.start()
            state.timings["broker_start_s"] = round(time.monotonic() - t0, 2)
            broker.create_topics((*INPUT_TOPICS, OUTPUT_TOPIC))
            cpu.watch("kafka broker", broker.pid)
            cpu.watch(self._bench_cpu_name, os.getpid())
            ready = self.work / f"{tag}.etl-ready"
            ready.unlink(missing_ok=True)
            group = f"kafka-etl-{uuid.uuid4().hex[:6]}"
            etl = ChildProcess(
                f"{tag}-etl",
                [
                    sys.executable,
                    "-m",
                    "deltabus.adapters.bench.kafka_etl",
                    "--bootstrap",
                    broker.bootstrap,
                    "--group",
                    group,
                    "--ready-file",
                    str(ready),
                ],
                env,
                self.work,
            ).start()
            cpu.watch("etl", etl.pid)
            state.specs = self._specs("kafka", state.rate, broker.bootstrap)
            handles = [ProducerHandle(s, cfg.producer_mode, env, self.work) for s in state.specs]
            t1 = time.monotonic()
            etl.wait_file(ready)
            for topic in INPUT_TOPICS:
                if not broker.wait_group_stable(f"{group}-{topic}"):
                    state.notes.append(f"the Kafka ETL was not seen consuming {topic} in 30 s")
            state.timings["etl_ready_s"] = round(time.monotonic() - t1, 2)
            for h in handles:
                h.wait_ready()
            consumer = KafkaUnifiedConsumer(
                broker.bootstrap, OUTPUT_TOPIC, cfg.consumer_poll_ms / 1000, stats
            )
            consumer.start()
            consumer.ready.wait(60)
            self._drive(state, handles, consumer, stats, cpu, [etl], None)
            inputs = broker.read_inputs(INPUT_TOPICS)
        finally:
            for h in handles:
                h.kill()
            if etl is not None:
                rc = etl.stop()
                if rc not in (0, None, -signal.SIGTERM, 128 + signal.SIGTERM):
                    state.errors.append(f"Kafka ETL exited with status {rc}: {etl.stderr_tail(5)}")
            if consumer is not None:
                consumer.stop()
            broker.stop()
            if (broker.dir / "kafka.log").is_file():
                shutil.copyfile(broker.dir / "kafka.log", self.work / f"{tag}-broker.log")
            shutil.rmtree(broker.dir, ignore_errors=True)
        if consumer.error is not None:
            state.errors.append(f"consumer failed: {consumer.error}")
        return inputs, consumer.table()

    # -- the measured part, common to both backbones ----------------------------------

    def _measure_idle(self, pids: dict[str, int], seconds: float) -> dict:
        """CPU and requests of the running pipeline with no traffic (what idling costs).

        Also per minute (`by_minute`, % of one core in all): MinIO's data scanner visits
        the folders the traffic changed in the first cycle after it, about a minute, so
        the first minute carries a deferred cost of the traffic and the later ones show
        what idling itself costs.
        """
        watched = {n: pid for n, pid in pids.items() if not n.startswith("producer")}

        def meter() -> CpuMeter:
            m = CpuMeter()
            for name, pid in watched.items():
                m.watch(name, pid)
            m.start()
            return m

        log.info("measuring the idle pipeline for %g s", seconds)
        idle = meter()
        if self.minio_requests:
            self.minio_requests.start()
        by_minute: list[dict[str, float]] = []
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            window = meter()
            time.sleep(min(IDLE_WINDOW_S, left))
            window.stop()
            by_minute.append(window.report())
        idle.stop()
        out: dict = {
            "seconds": seconds,
            "cpu_pct_of_one_core": idle.report(),
            "by_minute": [
                {
                    "all": round(sum(v for k, v in w.items() if not k.startswith("machine")), 1),
                    **{k: v for k, v in w.items() if not k.startswith("machine")},
                }
                for w in by_minute
            ],
        }
        if self.minio_requests:
            self.minio_requests.stop()
            out["requests_per_s"] = self.minio_requests.per_second()
        return out

    def _first_after_idle(
        self, lake: Lake, consumer: DeltaUnifiedConsumer | PartitionedConsumer
    ) -> dict | None:
        """What the first messages after the idle window wait (their tails had backed off):
        `first_after_idle_s`, their end-to-end latency as every sample's (seen minus
        scheduled send time), and `producer_start_to_seen_s`, from starting a producer
        (which opens its tables first) until the consumer saw them all. None when they
        did not arrive within 30 s."""
        from deltabus.apps.timezones.producer import Producer, ProducerConfig

        seen = consumer.inserted
        config = ProducerConfig(
            rate=1000,
            count=AFTER_IDLE_COUNT,
            commit_interval=self.cfg.commit_interval,
            run_id=AFTER_IDLE_RUN,
        )
        sent = time.monotonic()
        Producer(lake, config).run()
        deadline = sent + 30
        while consumer.inserted < seen + AFTER_IDLE_COUNT:
            if time.monotonic() > deadline or consumer.error is not None:
                return None
            time.sleep(0.002)
        waited = round(time.monotonic() - sent, 3)
        rows = consumer.table()
        probe = rows.filter(
            pc.starts_with(rows.column("message").cast(pa.string()), f"{AFTER_IDLE_RUN}-")
        )
        latency = pc.subtract(probe.column("seen_ms"), probe.column("timestamp"))
        first = round(pc.max(latency).as_py() / 1000, 3)
        log.info(
            "first messages after the idle window: latency %.3f s "
            "(%.3f s from starting a producer)",
            first,
            waited,
        )
        return {"first_after_idle_s": first, "producer_start_to_seen_s": waited}

    def _drive(
        self,
        state: RunState,
        handles: list[ProducerHandle],
        consumer,
        stats: LiveStats,
        cpu: CpuMeter,
        etls: list[ChildProcess],
        drain,
        begin=None,
    ) -> None:
        """Start the producers on one schedule, show progress until they end, then wait
        for the consumer. `begin(start_ms)` is called with the schedule origin (epoch ms)
        before any producer gets it."""
        cfg = self.cfg
        requests = self.minio_requests if state.backbone == "delta" else None
        total = sum(s.total for s in state.specs)
        start_us = int((time.time() + START_DELAY_S) * 1_000_000)
        state.start_ms = start_us / 1000
        stats.warmup_end_ms = state.start_ms + cfg.warmup * 1000
        if begin is not None:
            begin(state.start_ms)
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
                if dead := [e for e in _running_etls(etls, state.drain) if not e.alive()]:
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
            # Wait for the consumer: all messages seen, or no progress for `grace` s.
            cap = time.monotonic() + MAX_DRAIN_WAIT_FACTOR * cfg.duration + 60
            while consumer.inserted < total and consumer.error is None:
                if time.monotonic() - max(consumer.last_progress, produce_end) > cfg.grace:
                    log.warning("no new rows for %g s: giving up waiting", cfg.grace)
                    break
                if time.monotonic() > cap:
                    log.warning("still missing rows after the wait cap: giving up")
                    break
                if dead := [e for e in _running_etls(etls, state.drain) if not e.alive()]:
                    state.errors.append(f"the ETL process died: {dead[0].stderr_tail(5)}")
                    break
                show("draining")
                time.sleep(0.25)
            show("done")
        state.timings["consumer_done_after_produce_s"] = round(
            time.time() - state.timings["produce_end_ms"] / 1000, 2
        )


def _json_lines(path: Path) -> list[dict]:
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    except OSError:
        pass
    return out


def _running_etls(etls: list[ChildProcess], drain: Drain | None) -> list[ChildProcess]:
    """The ETL processes that should be running now. A backlog drain takes process 0
    (`etls[0]`) down: stopped with SIGSTOP it stays alive; with SIGTERM it is gone until
    its restart is appended to `etls`."""
    if drain is None or drain.signal == "stop":
        return etls
    return etls[1:]
