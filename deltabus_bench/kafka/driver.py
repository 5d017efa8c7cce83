"""The Kafka backbone: a real broker, the Kafka ETL as its own process (Pathway's,
kafka_etl, or with --etl kafka-streams the Kafka Streams topology, kafka_streams_etl) and
a consumer of the output topic, on the same workload as the Delta backbone."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from deltabus.core.processes import ChildProcess, child_env
from deltabus.delta.lake import Lake
from deltabus_bench.consumer import LiveStats
from deltabus_bench.drivers import DriverContext, Pipeline
from deltabus_bench.environment import CpuMeter
from deltabus_bench.kafka.consumer import KafkaUnifiedConsumer
from deltabus_bench.run_state import RunState
from deltabus_bench.workload import ProducerHandle

if TYPE_CHECKING:
    from deltabus_bench.kafka.broker import KafkaBroker


class KafkaDriver:
    """One Kafka run (deltabus_bench.drivers); the broker's data is scratch,
    removed after the run, its log kept in logs/."""

    def __init__(self, context: DriverContext, lake: Lake, state: RunState) -> None:
        self.context = context
        self.cfg = context.cfg
        self.state = state
        self.tag = f"kafka-{state.rate}"
        self.env = child_env(lake.settings)
        self.broker: KafkaBroker | None = None
        self.etl: ChildProcess | None = None
        self.handles: list[ProducerHandle] = []
        self.consumer: KafkaUnifiedConsumer | None = None
        self.inputs: pa.Table | None = None

    def start(self) -> Pipeline:
        from deltabus_bench.kafka.broker import KafkaBroker
        from deltabus_bench.kafka.etl import INPUT_TOPICS, OUTPUT_TOPIC

        cfg, state, work = self.cfg, self.state, self.context.work
        cpu = CpuMeter()
        stats = LiveStats()
        broker = self.broker = KafkaBroker(
            Path(tempfile.mkdtemp(prefix=f"deltabus-bench-{self.tag}-"))
        )
        t0 = time.monotonic()
        broker.start()
        state.timings["broker_start_s"] = round(time.monotonic() - t0, 2)
        broker.create_topics((*INPUT_TOPICS, OUTPUT_TOPIC))
        cpu.watch("kafka broker", broker.pid)
        cpu.watch(self.context.bench_cpu_name, os.getpid())
        ready = work / f"{self.tag}.etl-ready"
        ready.unlink(missing_ok=True)
        group = f"kafka-etl-{uuid.uuid4().hex[:6]}"
        if cfg.etl == "kafka-streams":
            from deltabus_bench.kafka import streams_etl as kafka_streams_etl

            commit_ms = max(1, round(cfg.commit_interval * 1000))
            command = kafka_streams_etl.command(broker.bootstrap, group, commit_ms, ready)
            groups = [group]  # one application.id for both input topics
        else:
            command = [sys.executable, "-m", "deltabus_bench.kafka.etl"]
            command += ["--bootstrap", broker.bootstrap, "--group", group]
            command += ["--ready-file", str(ready)]
            groups = [f"{group}-{topic}" for topic in INPUT_TOPICS]
        self.etl = ChildProcess(f"{self.tag}-etl", command, self.env, work).start()
        cpu.watch("etl", self.etl.pid)
        state.specs = self.context.specs("kafka", state.rate, broker.bootstrap)
        self.handles = [ProducerHandle(s, cfg.producer_mode, self.env, work) for s in state.specs]
        t1 = time.monotonic()
        self.etl.wait_file(ready)
        for name in groups:
            if not broker.wait_group_stable(name):
                state.notes.append(f"the Kafka ETL's group {name} was not seen consuming in 30 s")
        state.timings["etl_ready_s"] = round(time.monotonic() - t1, 2)
        for h in self.handles:
            h.wait_ready()
        self.consumer = KafkaUnifiedConsumer(
            broker.bootstrap, OUTPUT_TOPIC, cfg.consumer_poll_ms / 1000, stats
        )
        self.consumer.start()
        self.consumer.ready.wait(60)
        return Pipeline(
            handles=self.handles, consumer=self.consumer, stats=stats, cpu=cpu, etls=[self.etl]
        )

    def finish(self, pipeline: Pipeline) -> None:
        from deltabus_bench.kafka.etl import INPUT_TOPICS

        assert self.broker is not None
        self.inputs = self.broker.read_inputs(INPUT_TOPICS)

    def stop(self) -> None:
        state = self.state
        for h in self.handles:
            h.kill()
        if self.etl is not None:
            rc = self.etl.stop()
            if rc not in (0, None, -signal.SIGTERM, 128 + signal.SIGTERM):
                state.errors.append(f"Kafka ETL exited with status {rc}: {self.etl.stderr_tail(5)}")
        if self.consumer is not None:
            self.consumer.stop()
        if self.broker is not None:
            broker = self.broker
            broker.stop()
            if (broker.dir / "kafka.log").is_file():
                shutil.copyfile(
                    broker.dir / "kafka.log", self.context.work / f"{self.tag}-broker.log"
                )
            shutil.rmtree(broker.dir, ignore_errors=True)
        if self.consumer is not None and self.consumer.error is not None:
            state.errors.append(f"consumer failed: {self.consumer.error}")

    def tables(self) -> tuple[pa.Table, pa.Table]:
        assert self.inputs is not None and self.consumer is not None
        return self.inputs, self.consumer.table()
