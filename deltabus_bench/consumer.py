"""Consumers that tail the unified output and record when they first see every row.

`seen_ms` is stamped once the rows are in the consumer's hands (after the read), as a
user's consumer would experience it. Live statistics (window percentiles, running p99
from a 1 ms histogram) feed the progress display without touching the stored samples.
Every batch is kept for the per-message analysis, or, given a `sink`, handed to it and
not kept (a windowed soak aggregates as it goes: deltabus_bench.soak_windows).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

SEEN_SCHEMA = pa.schema(
    [
        ("message", pa.string()),
        ("timestamp", pa.float64()),  # sent_ms as the ETL parsed it
        ("etl_processed_ms", pa.float64()),
        ("unified_commit_ms", pa.float64()),
        ("seen_ms", pa.float64()),
        ("diff", pa.int64()),
    ]
)
HIST_MAX_MS = 600_000
UNIFIED_JSON = {"timestamp": pl.Float64, "message": pl.String, "time": pl.Int64, "diff": pl.Int64}


class LiveStats:
    """Latency of recently seen rows and a running histogram after the warm-up.

    Only the live display reads it, so a snapshot is recomputed at most every
    `refresh_s`: the benchmark's own progress line must not be charged to the consumer
    (recomputed every 0.25 s over the whole histogram it took 3 % of a core at 10k msg/s).
    """

    def __init__(
        self, warmup_end_ms: float | None = None, window_s: float = 5.0, refresh_s: float = 1.0
    ) -> None:
        self.warmup_end_ms = warmup_end_ms
        self.window_s = window_s
        self.refresh_s = refresh_s
        self.recent: deque[tuple[float, np.ndarray]] = deque()
        self.hist = np.zeros(HIST_MAX_MS + 1, dtype=np.int64)
        self.hist_top = -1  # highest bin in use: the running p99 sums no further
        self.latest_sent_ms = 0.0
        self.lock = threading.Lock()
        self._snapshot: tuple[float, dict] | None = None

    def add(self, seen_ms: float, sent_ms: np.ndarray) -> None:
        if sent_ms.size == 0:
            return
        lat = seen_ms - sent_ms
        with self.lock:
            self.recent.append((seen_ms / 1000, lat))
            self.latest_sent_ms = max(self.latest_sent_ms, float(sent_ms.max()))
            if self.warmup_end_ms is not None:
                kept = lat[sent_ms >= self.warmup_end_ms]
                if kept.size:
                    idx = np.clip(kept, 0, HIST_MAX_MS).astype(np.int64)
                    top = int(idx.max())
                    self.hist[: top + 1] += np.bincount(idx, minlength=top + 1)
                    self.hist_top = max(self.hist_top, top)

    def snapshot(self) -> dict:
        now = time.time()
        if self._snapshot is not None and now - self._snapshot[0] < self.refresh_s:
            return dict(self._snapshot[1])
        with self.lock:
            while self.recent and self.recent[0][0] < now - self.window_s:
                self.recent.popleft()
            window = np.concatenate([a for _, a in self.recent]) if self.recent else None
            running_p99 = None
            if self.hist_top >= 0:
                cum = np.cumsum(self.hist[: self.hist_top + 1])
                running_p99 = float(np.searchsorted(cum, 0.99 * cum[-1])) / 1000
            latest = self.latest_sent_ms
        p50 = p99 = None
        if window is not None:
            p50, p99 = (float(v) / 1000 for v in np.percentile(window, [50, 99]))
        out = {
            "window_p50": p50,
            "window_p99": p99,
            "running_p99": running_p99,
            "e2e_lag_s": (now * 1000 - latest) / 1000 if latest else None,
        }
        self._snapshot = (now, out)
        return dict(out)


Sink = Callable[[pa.Table], None]


class TailConsumer(threading.Thread):
    """Base: poll, stamp, keep every batch (or hand it to `sink`, keeping none: `table()`
    is then empty); subclasses implement `poll_once`."""

    def __init__(
        self, poll_s: float, stats: LiveStats, name: str, sink: Sink | None = None
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.poll_s = poll_s
        self.stats = stats
        self.sink = sink
        self.stop_event = threading.Event()
        self.parts: list[pa.Table] = []
        self.rows = 0
        self.inserted = 0
        self.error: BaseException | None = None
        self.last_progress = time.monotonic()
        self.ready = threading.Event()

    def poll_once(self) -> pa.Table | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self) -> None:
        from deltabus.core.gctune import tune_gc_for_streaming

        try:
            self.setup()
            tune_gc_for_streaming()
            self.ready.set()
            while not self.stop_event.is_set():
                batch = self.poll_once()
                if batch is None or batch.num_rows == 0:
                    self.idle()
                    continue
                if self.sink is not None:
                    self.sink(batch)
                else:
                    self.parts.append(batch)
                self.rows += batch.num_rows
                inserts = batch.filter(pc.equal(batch["diff"], 1))
                self.inserted += inserts.num_rows
                self.last_progress = time.monotonic()
                self.stats.add(
                    float(batch["seen_ms"][0].as_py()),
                    inserts["timestamp"].to_numpy(zero_copy_only=False),
                )
        except BaseException as exc:  # noqa: BLE001 - surfaced by the runner
            log.exception("consumer failed")
            self.error = exc
        finally:
            self.ready.set()
            self.teardown()

    def setup(self) -> None:
        pass

    def idle(self) -> None:
        """Nothing new: wait before the next poll."""
        self.stop_event.wait(self.poll_s)

    def teardown(self) -> None:
        pass

    def stop(self, timeout: float = 30) -> None:
        self.stop_event.set()
        self.join(timeout)

    def table(self) -> pa.Table:
        if not self.parts:
            return SEEN_SCHEMA.empty_table()
        return pa.concat_tables(self.parts)


class DeltaUnifiedConsumer(TailConsumer):
    """Tails `timezone_unified` like the ETL tails its inputs: one GET of the next commit.

    Every row keeps its `diff`: +1 rows are what the live statistics and the first-seen
    samples count, -1 rows (retractions) are kept for the analysis to account for.
    """

    DATA_COLUMNS = ["message", "timestamp", "time", "diff"]

    def __init__(
        self,
        lake,
        poll_s: float,
        stats: LiveStats,
        table: str | None = None,
        sink: Sink | None = None,
    ) -> None:
        from deltabus.apps.timezones.contracts import UNIFIED_TABLE

        self.table_name = table or UNIFIED_TABLE
        super().__init__(poll_s, stats, name=f"consumer-{self.table_name}", sink=sink)
        self.lake = lake
        self.dt = None
        self.next_version = 0  # 0: the version after the current one when it starts
        self.versions = 0
        self._tail = None
        self._pacer = None

    def setup(self) -> None:
        from deltabus.bus.pacing import Pacer
        from deltabus.bus.tail import DeltaLogTail
        from deltabus.core.retry import retry_storage

        table = self.table_name
        dt = retry_storage(lambda: self.lake.open(table), what=f"open {table}")
        self.dt = dt
        if self.next_version <= 0:
            self.next_version = dt.version() + 1
        self._tail = DeltaLogTail(self.lake, table, columns=self.DATA_COLUMNS)
        self._pacer = Pacer(self.lake, table, self.poll_s, self.stop_event)
        # The table state before the first version to read, loaded now, not on the hot path.
        tail = self._tail
        retry_storage(lambda: tail.start(self.next_version), what="read the unified table state")

    def idle(self) -> None:
        """Nothing to do: every poll waits for its pacer first (`poll_once`)."""

    def poll_once(self) -> pa.Table | None:
        from deltabus.core.retry import retry_storage

        # Also after a poll that found rows: polling again at once would only miss.
        self._pacer.wait()
        tail = self._tail
        # One GET of the next commit file says whether it landed and what it added.
        parts = []
        notified = self._pacer.latest_notified()
        upto = notified if notified is not None and notified >= self.next_version else None
        found, commit_ms = 0, None
        while upto is None or self.next_version <= upto:
            version = self.next_version
            commit = retry_storage(lambda v=version: tail.commit(v), what="poll timezone_unified")
            if commit is None:
                break
            rows = retry_storage(lambda c=commit: tail.rows(c), what="read timezone_unified")
            self.next_version += 1
            self.versions += 1
            found, commit_ms = found + 1, commit.timestamp_ms
            if rows is not None:
                parts.append(rows)
            if upto is None and not self._pacer.next_landed(commit_ms):
                break  # the next one is not due yet: no GET that would find nothing
        self._pacer.found(found, commit_ms)
        if not parts:
            return None
        seen_ms = time.time() * 1000
        frame = pl.from_arrow(pa.concat_tables(parts))
        assert isinstance(frame, pl.DataFrame)
        frame = frame.select(
            message=pl.col("message").cast(pl.String),
            timestamp=pl.col("timestamp").cast(pl.Float64),
            etl_processed_ms=pl.col("time").cast(pl.Float64),
            unified_commit_ms=pl.col("_commit_timestamp")
            .cast(pl.Datetime("ms"))
            .dt.epoch("ms")
            .cast(pl.Float64),
            seen_ms=pl.lit(seen_ms, pl.Float64),
            diff=pl.col("diff").cast(pl.Int64),
        )
        return frame.to_arrow().cast(SEEN_SCHEMA)


class PartitionedConsumer:
    """One `DeltaUnifiedConsumer` per unified partition, seen as one consumer by the runner:
    a reader of a partitioned stream reads every partition (as a Kafka consumer of every
    partition of a topic would)."""

    def __init__(
        self, lake, poll_s: float, stats: LiveStats, tables: list[str], sink: Sink | None = None
    ) -> None:
        self.parts = [DeltaUnifiedConsumer(lake, poll_s, stats, table=t, sink=sink) for t in tables]
        self.next_versions: dict[str, int] = {}
        self.ready = threading.Event()

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.parts)

    @property
    def inserted(self) -> int:
        return sum(c.inserted for c in self.parts)

    @property
    def last_progress(self) -> float:
        return max(c.last_progress for c in self.parts)

    @property
    def error(self) -> BaseException | None:
        return next((c.error for c in self.parts if c.error is not None), None)

    def start(self) -> None:
        for c in self.parts:
            c.next_version = self.next_versions.get(c.table_name, 0)
            c.start()
        for c in self.parts:
            c.ready.wait(60)
        self.ready.set()

    def stop(self, timeout: float = 30) -> None:
        for c in self.parts:
            c.stop_event.set()
        for c in self.parts:
            c.join(timeout)

    def table(self) -> pa.Table:
        return pa.concat_tables([c.table() for c in self.parts])


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
