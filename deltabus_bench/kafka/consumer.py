"""The Kafka consumer: topic `timezone_unified` read from the beginning
(deltabus_bench.consumer has what every consumer shares)."""

from __future__ import annotations

import io
import logging
import time

import numpy as np
import polars as pl
import pyarrow as pa

from deltabus_bench.consumer import (
    SEEN_SCHEMA,
    UNIFIED_JSON,
    LiveStats,
    TailConsumer,
)

log = logging.getLogger(__name__)


class KafkaUnifiedConsumer(TailConsumer):
    """Reads topic `timezone_unified` from the beginning (no group join on the hot path)."""

    def __init__(self, bootstrap: str, topic: str, poll_s: float, stats: LiveStats) -> None:
        super().__init__(poll_s, stats, name="kafka-unified-consumer")
        self.bootstrap = bootstrap
        self.topic = topic
        self.consumer = None

    def setup(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-consumer-{time.time_ns()}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
                "fetch.min.bytes": 1,
            }
        )
        self.consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])

    def poll_once(self) -> pa.Table | None:
        msgs = self.consumer.consume(num_messages=20_000, timeout=self.poll_s)
        if not msgs:
            return None
        seen_ms = time.time() * 1000
        values, stamps = [], []
        for m in msgs:
            if m.error() is not None:
                if m.error().code() == -191:  # _PARTITION_EOF
                    continue
                raise RuntimeError(f"Kafka consumer error: {m.error()}")
            values.append(m.value())
            stamps.append(m.timestamp()[1])
        if not values:
            return None
        frame = pl.read_ndjson(io.BytesIO(b"\n".join(values)), schema=UNIFIED_JSON)
        frame = frame.select(
            message=pl.col("message"),
            timestamp=pl.col("timestamp"),
            etl_processed_ms=pl.col("time").cast(pl.Float64),
            unified_commit_ms=pl.Series(np.asarray(stamps, dtype=np.float64)),
            seen_ms=pl.lit(seen_ms, pl.Float64),
            diff=pl.col("diff"),
        )
        return frame.to_arrow().cast(SEEN_SCHEMA)

    def teardown(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
