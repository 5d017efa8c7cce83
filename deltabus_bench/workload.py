"""The benchmark's open-loop producers, for both backbones.

Delta: `apps.timezones.producer.Producer`, unchanged. Kafka: the same schedule (message i is
due at start + i/rate; `date` is that scheduled time, in the zone of its table, with the
same seeded table choice) sent with confluent-kafka to topics timezone1/timezone2 as
JSON {date, message}, keyed by message.

A producer runs in the benchmark process (a thread) or in its own process
(`python -m deltabus_bench.workload`, JSON lines on stdout). The process protocol:
the child prints {"event": "ready"} once its imports and connections are done, reads the
schedule origin (epoch µs) from stdin, produces, printing {"event": "progress", ...} and
finally {"event": "done", "report": {...}} (or {"event": "error", ...}).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
# Kafka 4's producer default (librdkafka's too): users batch for 5 ms unless they tune it;
# the side-by-side runs Kafka as it ships rather than tuned for single-message latency.
KAFKA_LINGER_MS = 5

Progress = Callable[[dict], None]
WARMUP_TOPIC = "bench-warmup"  # never read: only warms the producer path up
WARMUP_BATCHES = 60  # x 1000 records


@dataclass(frozen=True)
class ProducerSpec:
    backbone: str  # "delta" | "kafka"
    rate: float
    duration: float
    commit_interval: float
    seed: int
    run_id: str
    bootstrap: str = ""  # kafka only

    @property
    def total(self) -> int:
        return int(round(self.duration * self.rate))

    def scheduled_after(self, warmup_s: float) -> int:
        """Messages whose scheduled send time is >= start + warmup (same rounding as sent)."""
        offsets_us = np.round(np.arange(self.total, dtype=np.int64) * (1_000_000.0 / self.rate))
        return int(np.count_nonzero(offsets_us >= warmup_s * 1_000_000))


# -- Delta ------------------------------------------------------------------------------


class DeltaWorkload:
    """The time-zone producer, opened (layout, input streams) before the schedule starts."""

    def __init__(self, spec: ProducerSpec, lake=None) -> None:
        from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
        from deltabus.core.settings import load_settings
        from deltabus.delta.lake import Lake

        self.spec = spec
        self.lake = lake or Lake(load_settings())
        config = ProducerConfig(
            rate=spec.rate,
            duration=spec.duration,
            commit_interval=spec.commit_interval,
            seed=spec.seed,
            run_id=spec.run_id,
        )
        self.producer = TimezoneProducer(self.lake, config)
        self.producer.open()

    def run(self, start_us: int, on_progress: Progress) -> dict:
        # As often as the display refreshes: "produced" must not trail "seen" by seconds.
        report = self.producer.run(
            on_progress=on_progress, progress_every_s=0.25, start_us=start_us
        )
        return report.as_dict()


# -- Kafka ------------------------------------------------------------------------------


def kafka_chunk(spec: ProducerSpec, start_us: int, lo: int, hi: int):
    """Messages [lo, hi): (topic, key, JSON value) lists, built vectorised with Polars."""
    import polars as pl

    from deltabus.apps.timezones.contracts import INPUT_TABLES, TABLE_ZONES
    from deltabus.apps.timezones.producer import DATE_FORMAT_POLARS, table_choice

    index = np.arange(lo, hi, dtype=np.int64)
    due_us = start_us + np.round(index * (1_000_000.0 / spec.rate)).astype(np.int64)
    choice = table_choice(spec.seed, index)
    due = pl.Series("due", due_us).cast(pl.Datetime("us", "UTC"))
    frame = pl.DataFrame({"i": index, "due": due, "choice": choice})
    dates = [
        pl.col("due").dt.convert_time_zone(TABLE_ZONES[t]).dt.strftime(DATE_FORMAT_POLARS)
        for t in INPUT_TABLES
    ]
    frame = frame.select(
        topic=pl.when(pl.col("choice") == 0)
        .then(pl.lit(INPUT_TABLES[0]))
        .otherwise(pl.lit(INPUT_TABLES[1])),
        message=pl.lit(f"{spec.run_id}-") + pl.col("i").cast(pl.String),
        date=pl.when(pl.col("choice") == 0).then(dates[0]).otherwise(dates[1]),
    ).with_columns(value=pl.format('{{"date":"{}","message":"{}"}}', "date", "message"))
    return frame["topic"].to_list(), frame["message"].to_list(), frame["value"].to_list()


class KafkaWorkload:
    """Open loop over Kafka: every message is handed to librdkafka when it comes due."""

    TICK_S = 0.001  # wake-up granularity
    CHUNK_S = 0.1  # messages are prepared this far ahead

    def __init__(self, spec: ProducerSpec) -> None:
        from confluent_kafka import Producer

        self.spec = spec
        self.errors = 0
        self.producer = Producer(
            {
                "bootstrap.servers": spec.bootstrap,
                "linger.ms": KAFKA_LINGER_MS,
                "acks": "all",
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 1_048_576,
            }
        )
        self.producer.list_topics(timeout=30)  # connected before the schedule starts
        # Warm up off the measured topics: the chunk builder, librdkafka and the broker's
        # produce path (JIT) get their first-call costs out of the way.
        # A fresh JVM broker needs some tens of thousands of records (seconds) before its
        # append path is compiled: send them here, paced in small batches.
        _, keys, values = kafka_chunk(spec, 0, 0, 1000)
        for _ in range(WARMUP_BATCHES):
            for key, value in zip(keys, values, strict=True):
                self.producer.produce(WARMUP_TOPIC, value, key)
            self.producer.flush(30)

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.errors += 1

    def run(self, start_us: int, on_progress: Progress) -> dict:
        s = self.spec
        total, start = s.total, start_us / 1_000_000
        per_chunk = max(1, int(s.rate * self.CHUNK_S))
        lo = 0
        buf: tuple[list, list, list] = ([], [], [])
        buf_lo = 0
        max_lag = final_lag = 0.0
        last_progress = time.monotonic()
        wall_start = time.time()
        produce, poll = self.producer.produce, self.producer.poll
        while lo < total:
            now = time.time()
            hi = min(total, math.floor((now - start) * s.rate) + 1) if now >= start else 0
            if hi > lo:
                final_lag = max(0.0, now - (start + lo / s.rate))
                max_lag = max(max_lag, final_lag)
                while lo < hi:
                    if lo >= buf_lo + len(buf[0]):
                        buf_lo = lo
                        buf = kafka_chunk(s, start_us, lo, min(total, lo + per_chunk))
                    end = min(hi, buf_lo + len(buf[0]))
                    topics, keys, values = buf
                    for j in range(lo - buf_lo, end - buf_lo):
                        while True:
                            try:
                                produce(topics[j], values[j], keys[j], on_delivery=self._delivered)
                                break
                            except BufferError:  # local queue full: let librdkafka drain
                                poll(0.01)
                    lo = end
                poll(0)
            if time.monotonic() - last_progress >= 1 or lo >= total:
                last_progress = time.monotonic()
                on_progress({"messages": lo, "total": total, "lag_s": round(final_lag, 3)})
            if lo < total:
                due = start + lo / s.rate
                time.sleep(max(self.TICK_S, due - time.time()))
        left = self.producer.flush(60)
        elapsed = time.time() - wall_start
        return {
            "run_id": s.run_id,
            "messages": total,
            "delivery_errors": self.errors,
            "undelivered_after_flush": left,
            "elapsed_s": round(elapsed, 3),
            "achieved_rate": round(total / elapsed, 1) if elapsed > 0 else 0.0,
            "target_rate": s.rate,
            "max_lag_s": round(max_lag, 3),
            "final_lag_s": round(final_lag, 3),
        }


def make_workload(spec: ProducerSpec, lake=None):
    return KafkaWorkload(spec) if spec.backbone == "kafka" else DeltaWorkload(spec, lake)


# -- running producers: in a thread or in a child process -----------------------------


class ProducerHandle:
    """One producer, inline or in its own process; the same interface for the runner."""

    def __init__(self, spec: ProducerSpec, mode: str, env: dict | None, log_dir: Path, lake=None):
        self.spec = spec
        self.mode = mode
        self.progress: dict = {"messages": 0, "total": spec.total, "lag_s": 0.0}
        self.report: dict | None = None
        self.error: str | None = None
        self.pid: int | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        if mode == "process":
            args = [
                sys.executable,
                "-m",
                "deltabus_bench.workload",
                json.dumps(asdict(spec)),
            ]
            self._stderr = open(log_dir / f"producer-{spec.run_id}.log", "wb")  # noqa: SIM115
            self._proc = subprocess.Popen(
                args,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                bufsize=1,
            )
            self.pid = self._proc.pid
            self._thread = threading.Thread(target=self._read_child, daemon=True)
            self._thread.start()
        else:
            self._workload = make_workload(spec, lake)
            self._ready.set()

    def _read_child(self) -> None:
        assert self._proc and self._proc.stdout
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "ready":
                self._ready.set()
            elif kind == "progress":
                self.progress = event
            elif kind == "done":
                self.report = event["report"]
            elif kind == "error":
                self.error = event.get("error", "producer failed")
        self._proc.wait()
        if self.report is None and self.error is None:
            self.error = f"producer process exited with status {self._proc.returncode}"
        self._ready.set()
        self._done.set()

    def wait_ready(self, timeout: float = 120) -> None:
        from deltabus.core.errors import DeltabusError

        if not self._ready.wait(timeout):
            raise DeltabusError(f"producer {self.spec.run_id} was not ready after {timeout:.0f}s")
        if self.error:
            raise DeltabusError(f"producer {self.spec.run_id}: {self.error}")

    def start(self, start_us: int) -> None:
        if self._proc is not None:
            assert self._proc.stdin
            self._proc.stdin.write(f"{start_us}\n")
            self._proc.stdin.flush()
            return

        def run() -> None:
            try:
                self.report = self._workload.run(start_us, self._on_progress)
            except Exception as exc:  # noqa: BLE001 - reported by the runner
                log.exception("producer %s failed", self.spec.run_id)
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                self._done.set()

        self._thread = threading.Thread(target=run, name=f"producer-{self.spec.run_id}")
        self._thread.start()

    def _on_progress(self, p: dict) -> None:
        self.progress = p

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="a benchmark producer (JSON lines protocol)")
    parser.add_argument("spec", help="ProducerSpec as JSON")
    args = parser.parse_args(argv)
    from deltabus.core.logs import setup_logging

    setup_logging()

    def emit(**event) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    try:
        spec = ProducerSpec(**json.loads(args.spec))
        workload = make_workload(spec)
        emit(event="ready")
        line = sys.stdin.readline()
        if not line.strip():
            return 1
        start_us = int(line)
        cpu0 = _cpu_s()
        report = workload.run(start_us, lambda p: emit(event="progress", **p))
        report["cpu_s"] = round(_cpu_s() - cpu0, 3)
        emit(event="done", report=report)
        return 0
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        log.exception("producer failed")
        emit(event="error", error=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
