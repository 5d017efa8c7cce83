"""What every consumer of the unified output shares: it records when it first sees every
row (the backbones' consumers: deltabus_bench.delta.consumer, deltabus_bench.kafka.consumer).

`seen_ms` is stamped once the rows are in the consumer's hands (after the read), as a
user's consumer would experience it. Live statistics (window percentiles, running p99
from a 1 ms histogram) feed the progress display without touching the stored samples.
Every batch is kept for the per-message analysis, or, given a `sink`, handed to it and
not kept (a windowed soak aggregates as it goes: deltabus_bench.soak_windows).
"""

from __future__ import annotations

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
