"""The producer: timestamped messages from two time zones, on an open-loop schedule.

Message i is due at start + i/rate whatever happened before; its `date` is that scheduled
time, so a slow producer shows up as latency, as it would for a user. Every commit
interval the messages that have come due are written as one Arrow batch per stream.

Each input stream is written by deltabus' stream producer (`deltabus.Bus.producer`) with
the run id as producer id, so a restarted run never writes a message twice: it goes on
from the records each stream has committed, with the start time and commit window the
run recorded as marks. Messages go to a partition by the layout's partitioner
(deltabus.apps.timezones.layout), the same on every restart.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa

import deltabus
from deltabus.apps.timezones.contracts import (
    FINISHED_MARK,
    INPUT_SCHEMA,
    INPUT_TABLES,
    TABLE_ZONES,
)
from deltabus.apps.timezones.layout import (
    SINGLE,
    TimezoneLayout,
    declare_inputs,
    ensure_layout,
    partition_of,
)
from deltabus.core import health
from deltabus.core.errors import ConfigError, StorageError
from deltabus.core.gctune import tune_gc_for_streaming
from deltabus.core.intervals import DEFAULT_COMMIT_INTERVAL_MS, check_interval
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.tables import (
    delta_columns,
    show_columns,
)

log = logging.getLogger(__name__)

DATE_FORMAT_POLARS = "%Y-%m-%d %H:%M:%S%.6f %z"  # == %Y-%m-%d %H:%M:%S.%f %z in Python
# The run id is the input streams' producer id: deltabus.Bus.producer's alphabet.
RUN_ID = re.compile(r"[a-z0-9_.-]+")
# How a run was marked before the inputs were streams (such a run is not resumed).
OLD_APP_ID = "deltabus-producer:{}"


@dataclass(frozen=True)
class ProducerConfig:
    """What to produce. Exactly one of `duration` (seconds) and `count` bounds the run."""

    rate: float
    duration: float | None = None
    count: int | None = None
    commit_interval: float = DEFAULT_COMMIT_INTERVAL_MS / 1000
    seed: int = 0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    start_us: int | None = None  # schedule origin (epoch µs); default: when the run starts
    # Partitions per stream (apps.timezones.layout); None: whatever the lake has (1 if new).
    partitions: int | None = None

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ConfigError(f"rate must be a positive number of msg/s, got {self.rate}")
        if (self.duration is None) == (self.count is None):
            raise ConfigError("give exactly one of duration and count")
        if self.duration is not None and not self.duration > 0:
            raise ConfigError(f"duration must be positive seconds, got {self.duration}")
        if self.count is not None and self.count < 0:
            raise ConfigError(f"count must be >= 0, got {self.count}")
        check_interval(self.commit_interval, "commit interval")
        if not RUN_ID.fullmatch(self.run_id):
            raise ConfigError(
                f"run id {self.run_id!r} is not usable",
                "use lower-case letters, digits, '_', '-' and '.'",
            )

    @property
    def total(self) -> int:
        if self.count is not None:
            return self.count
        return int(round(self.duration * self.rate))  # type: ignore[operator]

    @property
    def window(self) -> int:
        """Messages per commit window: whole, so windows (and the sticky partitioner's
        chunks, which follow them) start at the same message numbers on every restart."""
        return max(1, round(self.rate * self.commit_interval))


@dataclass
class ProducerReport:
    """What the producer achieved."""

    run_id: str
    messages: int
    per_table: dict[str, int]
    commits: int
    elapsed_s: float
    achieved_rate: float
    target_rate: float
    max_lag_s: float
    final_lag_s: float
    resumed_from: int
    partitions: int = 1

    @property
    def per_stream(self) -> dict[str, int]:
        """Messages written per logical stream (summed over its partitions)."""
        layout = TimezoneLayout(self.partitions)
        return {s: sum(self.per_table.get(t, 0) for t in layout.inputs(s)) for s in INPUT_TABLES}

    def as_dict(self) -> dict:
        return {**asdict(self), "per_stream": self.per_stream}


def table_choice(seed: int, index: np.ndarray) -> np.ndarray:
    """0 or 1 per message: a seeded hash of the index, independent of how rows are batched."""
    with np.errstate(over="ignore"):
        z = index.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) & (2**64 - 1))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z & np.uint64(1)).astype(np.int8)


class StreamBatch(NamedTuple):
    """One window's messages of one input stream, and the partition of each."""

    rows: pa.Table
    partitions: np.ndarray


def build_batches(
    run_id: str,
    seed: int,
    start_us: int,
    rate: float,
    lo: int,
    hi: int,
    skip_below: dict[str, int] | None = None,
    layout: TimezoneLayout = SINGLE,
    window: int = 1,
) -> dict[str, StreamBatch]:
    """Messages [lo, hi) as one Arrow table per input stream (vectorised, no row loop):
    a seeded choice of time zone, then the partition of the message id (its number and
    the run's commit `window`, deltabus.apps.timezones.layout).

    `skip_below[stream]` drops that stream's messages with a smaller index: they were
    committed before a restart.
    """
    index = np.arange(lo, hi, dtype=np.int64)
    due_us = start_us + np.round(index * (1_000_000.0 / rate)).astype(np.int64)
    choice = table_choice(seed, index)
    part = partition_of(run_id, index, layout, window)
    floors = skip_below or {}
    out = {}
    for n, stream in enumerate(INPUT_TABLES):
        mine = (choice == n) & (index >= floors.get(stream, 0))
        rows = (
            pl.DataFrame({"due": due_us[mine], "i": index[mine]})
            .select(
                date=pl.col("due")
                .cast(pl.Datetime("us", "UTC"))
                .dt.convert_time_zone(TABLE_ZONES[stream])
                .dt.strftime(DATE_FORMAT_POLARS),
                message=pl.lit(f"{run_id}-") + pl.col("i").cast(pl.String),
            )
            .to_arrow()
            .cast(INPUT_SCHEMA)
        )
        out[stream] = StreamBatch(rows, part[mine])
    return out


def message_index(seed: int, stream: int, count: int, total: int, chunk: int = 1 << 22) -> int:
    """The number of message `count` (from 0) of input `stream` (0 or 1) in a run of
    `total` messages, or `total` when the run has no more of them: where a resumed run
    goes on in a stream that has committed `count` records."""
    seen = 0
    for lo in range(0, total, chunk):
        index = np.arange(lo, min(total, lo + chunk), dtype=np.int64)
        mine = index[table_choice(seed, index) == stream]
        if seen + len(mine) > count:
            return int(mine[count - seen])
        seen += len(mine)
    return total


MAX_IN_FLIGHT = 3  # commits per stream queued behind the one being written


class _Progress:
    """Counts the rows of each partition table as commits complete (on the commit
    threads), and the lag behind schedule."""

    def __init__(self, tables: list[str]) -> None:
        self.written = dict.fromkeys(tables, 0)
        self.lag = 0.0
        self.max_lag = 0.0
        self._lock = threading.Lock()

    def committed(self, rows: dict[str, int], due: float) -> Callable[[Future], None]:
        def done(job: Future) -> None:
            if job.exception() is not None:
                return
            with self._lock:
                for table, n in rows.items():
                    self.written[table] += n
                self.lag = max(0.0, time.time() - due)
                self.max_lag = max(self.max_lag, self.lag)

        return done


class TimezoneProducer:
    """Writes the input streams (every partition) for one run id."""

    def __init__(self, lake: Lake, config: ProducerConfig) -> None:
        self.lake = lake
        self.config = config
        self.layout = TimezoneLayout(config.partitions or 1)  # the lake's, once `run` reads it
        self.producers: dict[str, deltabus.Producer] = {}
        self.pools: dict[str, ThreadPoolExecutor] = {}
        self._failed = threading.Event()

    def _resume_state(self) -> tuple[dict[str, int], int | None]:
        """Per stream: the number of its next message to write; the run's start time
        (None: a new run)."""
        cfg = self.config
        next_index, start_us = {}, None
        for n, stream in enumerate(INPUT_TABLES):
            producer = self.producers[stream]
            start = producer.mark("start_us")
            if start is None:
                next_index[stream] = 0
                continue
            self._check_window(stream, producer.mark("window"))
            start_us = start
            next_index[stream] = message_index(cfg.seed, n, producer.committed, cfg.total)
        return next_index, start_us

    def _check_window(self, name: str, recorded: int | None) -> None:
        """A resumed partitioned run keeps its commit window: the partition of every
        message it has still to write depends on it (deltabus.apps.timezones.layout)."""
        sticky = self.layout.partitions > 1 and self.layout.partitioner == "sticky"
        if not sticky or recorded is None or recorded == self.config.window:
            return
        raise ConfigError(
            f"run {self.config.run_id} was written to {name} with {recorded} messages per "
            f"commit window, and this resume would use {self.config.window} (--rate x "
            "--commit-interval-ms): its remaining messages would land in other partitions",
            "resume the run with the rate and commit interval it started with, or start a new "
            "run id",
        )

    def _commit(self, stream: str, batch: StreamBatch, hi: int, start_us: int, last: bool) -> None:
        # Commits queued behind a failed one must not land: the stream would then hold
        # messages up to `hi` while an earlier window is missing.
        if self._failed.is_set():
            raise RuntimeError(f"not committing {stream} up to {hi}: an earlier commit failed")
        cfg = self.config
        producer = self.producers[stream]
        try:
            if batch.rows.num_rows:
                producer.send_batch(batch.rows, partitions=batch.partitions)
            producer.flush(
                {
                    "producer.run_id": cfg.run_id,
                    "producer.next_index": hi,
                    "producer.start_us": start_us,
                    "producer.rate": cfg.rate,
                    "producer.finished": last,
                    "producer.total": cfg.total,
                },
                {
                    "start_us": start_us,
                    "window": cfg.window,
                    **({FINISHED_MARK: 1} if last else {}),
                },
                everywhere=last,  # every partition's readers see the run finish
            )
        except BaseException:
            self._failed.set()
            raise

    def _per_table(self, stream: str, batch: StreamBatch) -> dict[str, int]:
        """How many of `batch`'s rows go to each partition table of `stream`."""
        counts = np.bincount(batch.partitions, minlength=self.layout.partitions)
        return dict(zip(self.layout.inputs(stream), counts.tolist(), strict=True))

    def check_schemas(self) -> None:
        """Refuse input tables that exist with another schema than the contract, before
        anything is written to either table (a foreign table must not get half a run)."""
        expected = delta_columns(INPUT_SCHEMA)
        for name in self.layout.input_tables:
            present = retry_storage(
                lambda n=name: self.lake.settled_delta_or_absent(n), what=f"look for {name}"
            )
            if not present:
                continue
            dt = retry_storage(lambda n=name: self.lake.open(n), what=f"open {name}")
            if dt.transaction_version(OLD_APP_ID.format(self.config.run_id)) is not None:
                raise ConfigError(
                    f"run {self.config.run_id} was written to {name} by an older deltabus, "
                    "whose runs this one cannot resume; nothing was written",
                    "start a new run id",
                )
            found = delta_columns(dt.schema())
            if found != expected:
                raise StorageError(
                    f"table {name} at {self.lake.uri(name)} has columns ({show_columns(found)}), "
                    f"not the input contract ({show_columns(expected)}); nothing was written",
                    "point DELTABUS_PREFIX (or --prefix) at a deltabus lake, or move that "
                    "table away",
                )

    def open(self) -> None:
        """Open the lake's layout and the input streams (once), so that `run` starts
        producing at once; `run` opens them itself when they are not open."""
        if self.producers:
            return
        self.layout = ensure_layout(self.lake, self.config.partitions)
        self.check_schemas()
        declare_inputs(self.lake, self.layout)
        bus = deltabus.Bus(self.lake)
        try:
            for stream in INPUT_TABLES:
                self.producers[stream] = bus.producer(
                    stream, self.config.run_id, commit_interval_ms=0
                )
                self.pools[stream] = ThreadPoolExecutor(max_workers=1)
        except BaseException:
            self._close(failed=True)
            raise
        health.mark_ready()  # the lake's layout and the input streams are open

    def run(
        self,
        on_progress: Callable[[dict], None] | None = None,
        progress_every_s: float = 5.0,
        start_us: int | None = None,
    ) -> ProducerReport:
        """Produce the whole run. Every `progress_every_s` s `on_progress` gets the messages
        handed to the commit threads so far (a live display wants it often, a log rarely).
        `start_us`: the schedule origin (epoch µs), when it is known only after `open`; by
        default the config's."""
        self.open()
        try:
            report = self._run(on_progress, progress_every_s, start_us or self.config.start_us)
        except BaseException:
            self._close(failed=True)
            raise
        self._close(failed=False)
        return report

    def _close(self, failed: bool) -> None:
        """Stop the commit threads and the stream producers; after a failure, an error
        in closing is not raised over the failure's."""
        for pool in self.pools.values():
            pool.shutdown(wait=True)
        for producer in self.producers.values():
            if not failed:
                producer.close()
                continue
            with contextlib.suppress(Exception):
                producer.close()

    def _run(
        self,
        on_progress: Callable[[dict], None] | None,
        progress_every_s: float,
        origin_us: int | None,
    ) -> ProducerReport:
        cfg = self.config
        next_index, start_us = self._resume_state()
        tune_gc_for_streaming()
        resumed_from = min(next_index.values())
        wall_start = time.time()
        if start_us is None:
            start_us = origin_us or int(wall_start * 1_000_000)
        start = start_us / 1_000_000
        if resumed_from:
            log.info("run %s resumes at message %d of %d", cfg.run_id, resumed_from, cfg.total)
        lo = resumed_from
        stats = _Progress(self.layout.input_tables)
        last_progress = time.monotonic()
        per_window = cfg.window
        in_flight: dict[str, deque[Future]] = {name: deque() for name in INPUT_TABLES}
        finished = False  # a finished run resumed marks every partition finished again
        while not finished:
            # The next window closes when its last message comes due (open loop).
            window = lo // per_window + 1
            hi = min(cfg.total, window * per_window)
            due = start + hi / cfg.rate if hi < cfg.total else start + (cfg.total) / cfg.rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            else:
                # Behind schedule: send everything that is due now in one commit.
                hi = min(cfg.total, max(hi, int((time.time() - start) * cfg.rate)))
            last = hi >= cfg.total
            batches = build_batches(
                cfg.run_id,
                cfg.seed,
                start_us,
                cfg.rate,
                lo,
                hi,
                skip_below=next_index,
                layout=self.layout,
                window=per_window,
            )
            window_due = start + hi / cfg.rate
            for stream in INPUT_TABLES:
                batch = batches[stream]
                if batch.rows.num_rows == 0 and not last:
                    continue  # none of its messages in this window, or committed before
                queue = in_flight[stream]
                # Commits of a stream run in order on its own thread while the next window
                # is built; more than MAX_IN_FLIGHT waiting means storage is the bottleneck.
                while queue and (queue[0].done() or len(queue) >= MAX_IN_FLIGHT):
                    queue.popleft().result()
                job = self.pools[stream].submit(self._commit, stream, batch, hi, start_us, last)
                job.add_done_callback(stats.committed(self._per_table(stream, batch), window_due))
                queue.append(job)
            lo = hi
            finished = last
            if on_progress and (time.monotonic() - last_progress >= progress_every_s or finished):
                last_progress = time.monotonic()
                on_progress({"messages": hi, "total": cfg.total, "lag_s": round(stats.lag, 3)})
        for queue in in_flight.values():
            while queue:
                queue.popleft().result()
        commits = sum(p.commits for p in self.producers.values())
        written = stats.written
        max_lag, final_lag = stats.max_lag, stats.lag
        elapsed = time.time() - wall_start
        sent = sum(written.values())
        return ProducerReport(
            run_id=cfg.run_id,
            messages=sent,
            per_table=written,
            commits=commits,
            elapsed_s=round(elapsed, 3),
            achieved_rate=round(sent / elapsed, 1) if elapsed > 0 else 0.0,
            target_rate=cfg.rate,
            max_lag_s=round(max_lag, 3),
            final_lag_s=round(final_lag, 3),
            resumed_from=resumed_from,
            partitions=self.layout.partitions,
        )
