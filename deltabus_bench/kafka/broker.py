"""A throwaway Kafka broker for one benchmark run, through platform/kafka.sh.

The broker stamps records with LogAppendTime, so a record's timestamp is the moment it
was appended to the log: the Kafka analogue of "commit visible" in the stage breakdown.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from deltabus.core.errors import DeltabusError
from deltabus.core.net import port_taken, restartable_port
from deltabus.core.paths import platform_script

log = logging.getLogger(__name__)


def kafka_script() -> Path:
    explicit = os.environ.get("DELTABUS_KAFKA_SH")
    if explicit:
        return Path(explicit)
    return platform_script("kafka.sh")


START_ATTEMPTS = 3


class KafkaBroker:
    """A single-node KRaft broker on 127.0.0.1: the client port and, one above it, the
    controller's."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.dir = Path(data_dir)
        self.chose_port = port is None
        self.port = port or restartable_port(span=2)
        self.script = kafka_script()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        try:
            return int((self.dir / "kafka.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def start(self) -> KafkaBroker:
        """Start the broker and wait until it accepts connections.

        When the ports were chosen here and another process took one of them before
        the broker bound it, start again on a fresh pair (up to START_ATTEMPTS times)."""
        if not self.script.is_file():
            raise DeltabusError(f"{self.script} not found", "set DELTABUS_KAFKA_SH")
        self.dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, START_ATTEMPTS + 1):
            proc = self._run_start()
            if proc.returncode == 0:
                log.info("%s", proc.stdout.strip())
                return self
            if not (self.chose_port and attempt < START_ATTEMPTS and self._lost_a_port()):
                break
            log.warning(
                "Kafka's port %d or %d was taken before the broker bound it; "
                "starting again on a fresh pair",
                self.port,
                self.port + 1,
            )
            # The failed start formatted its log dir for the old controller address.
            shutil.rmtree(self.dir / "data", ignore_errors=True)
            self.port = restartable_port(span=2)
        if self._lost_a_port():
            hint = f"ports {self.port} and {self.port + 1} must both be free: stop what holds them"
        else:
            hint = "needs Java 17 and the cached jars: run `bash platform/kafka.sh fetch` once"
        raise DeltabusError(
            f"Kafka did not start: {(proc.stderr or proc.stdout).strip()[-600:]}", hint
        )

    def _run_start(self) -> subprocess.CompletedProcess[str]:
        cmd = [
            "bash",
            str(self.script),
            "start",
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--set",
            "log.message.timestamp.type=LogAppendTime",
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=180)

    def _lost_a_port(self) -> bool:
        """True when no broker of ours runs and something else holds one of its ports."""
        return self.pid is None and (port_taken(self.port) or port_taken(self.port + 1))

    def stop(self) -> None:
        subprocess.run(
            ["bash", str(self.script), "stop", "--dir", str(self.dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def create_topics(self, topics: tuple[str, ...]) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(t, 1, 1) for t in topics])
        for topic, fut in futures.items():
            try:
                fut.result(timeout=30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise DeltabusError(f"cannot create Kafka topic {topic}: {exc}") from exc

    def wait_group_stable(self, group: str, timeout: float = 30) -> bool:
        """True once `group` has members with partitions (the Kafka ETL is consuming)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
                assigned = sum(len(m.assignment.topic_partitions) for m in desc.members)
                if assigned:
                    return True
            except Exception:  # noqa: BLE001 - not there yet
                pass
            time.sleep(0.2)
        return False

    def read_inputs(self, topics: tuple[str, ...]) -> pa.Table:
        """Every input record: message, sent_ms (from `date`), input_commit_ms (append time)."""
        from confluent_kafka import Consumer, TopicPartition

        from deltabus.apps.timezones.producer import DATE_FORMAT_POLARS

        frames = []
        for topic in topics:
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"bench-readback-{time.time_ns()}",
                    "enable.auto.commit": False,
                }
            )
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
            consumer.assign([TopicPartition(topic, 0, 0)])
            values, stamps, got = [], [], 0
            deadline = time.monotonic() + 120
            while got < high and time.monotonic() < deadline:
                msgs = consumer.consume(num_messages=50_000, timeout=0.2)
                for m in msgs:
                    if m.error() is not None:
                        continue
                    values.append(m.value())
                    stamps.append(m.timestamp()[1])
                    got = m.offset() + 1
            consumer.close()
            if not values:
                continue
            import io

            frame = pl.read_ndjson(
                io.BytesIO(b"\n".join(values)), schema={"date": pl.String, "message": pl.String}
            )
            frames.append(
                frame.select(
                    "message",
                    sent_ms=pl.col("date")
                    .str.strptime(pl.Datetime("us", "UTC"), DATE_FORMAT_POLARS)
                    .dt.epoch("us")
                    .cast(pl.Float64)
                    / 1000,
                    input_commit_ms=pl.Series(np.asarray(stamps, dtype=np.float64)),
                )
            )
        if not frames:
            from deltabus_bench.analysis import INPUTS_SCHEMA

            return INPUTS_SCHEMA.empty_table()
        return pl.concat(frames).to_arrow()
