"""The producer: timestamped messages from two time zones, on an open-loop schedule.

Message i is due at start + i/rate whatever happened before; its `date` is that scheduled
time, so a slow producer shows up as latency, as it would for a user. Every commit
interval the messages that have come due are written as one Arrow batch per table.
Each commit carries an idempotency marker (app transaction `deltabus-producer:<run id>`)
and the next message index, so a restarted producer with the same run id never writes a
message twice and continues where it stopped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from deltabus.apps.timezones.contracts import INPUT_SCHEMA, INPUT_TABLES, TABLE_ZONES
from deltabus.apps.timezones.layout import (
    SINGLE,
    Layout,
    declare_inputs,
    ensure_layout,
    partition_of,
)
from deltabus.core.errors import ConfigError, StorageError
from deltabus.core.gctune import tune_gc_for_streaming
from deltabus.core.intervals import DEFAULT_COMMIT_INTERVAL_MS, check_interval
from deltabus.core.retry import retry_storage
from deltabus.delta.append import TableAppender
from deltabus.delta.checkpoints import BackgroundCheckpointer
from deltabus.delta.lake import Lake
from deltabus.delta.tables import (
    delta_columns,
    ensure_table,
    find_commit,
    meta,
    metadata,
    show_columns,
)

log = logging.getLogger(__name__)

DATE_FORMAT_POLARS = "%Y-%m-%d %H:%M:%S%.6f %z"  # == %Y-%m-%d %H:%M:%S.%f %z in Python


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
        if not self.run_id or any(c in self.run_id for c in "/: "):
            raise ConfigError(f"run id must be a non-empty word, got {self.run_id!r}")

    @property
    def total(self) -> int:
        if self.count is not None:
            return self.count
        return int(round(self.duration * self.rate))  # type: ignore[operator]

    @property
    def app_id(self) -> str:
        return f"deltabus-producer:{self.run_id}"

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
        layout = Layout(self.partitions)
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


def build_batches(
    run_id: str,
    seed: int,
    start_us: int,
    rate: float,
    lo: int,
    hi: int,
    skip_below: dict[str, int] | None = None,
    layout: Layout = SINGLE,
    window: int = 1,
) -> dict[str, pa.Table]:
    """Messages [lo, hi) as one Arrow table per input table (vectorised, no row loop):
    a seeded choice of time zone, then the partition of the message id (its number and
    the run's commit `window`, deltabus.apps.timezones.layout).

    `skip_below[table]` drops that table's messages with a smaller index: they were
    committed before a restart. Dates and ids are formatted once per stream and then
    split by partition, so a window costs the same whatever the partition count.
    """
    index = np.arange(lo, hi, dtype=np.int64)
    due_us = start_us + np.round(index * (1_000_000.0 / rate)).astype(np.int64)
    choice = table_choice(seed, index)
    part = partition_of(run_id, index, layout, window)
    floors = skip_below or {}
    out = {}
    for n, stream in enumerate(INPUT_TABLES):
        mine = choice == n
        ids, parts = index[mine], part[mine]
        rows = (
            pl.DataFrame({"due": due_us[mine], "i": ids})
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
        for p, table in enumerate(layout.inputs(stream)):
            keep = ids >= floors.get(table, 0)
            if layout.partitions > 1:
                keep &= parts == p
            out[table] = rows if keep.all() else rows.filter(pa.array(keep))
    return out


MAX_IN_FLIGHT = 3  # commits per table queued behind the one being written


class _Progress:
    """Counts commits as they complete (on the commit threads) and the lag behind schedule."""

    def __init__(self, tables: list[str]) -> None:
        self.commits = 0
        self.written = dict.fromkeys(tables, 0)
        self.lag = 0.0
        self.max_lag = 0.0
        self._lock = threading.Lock()

    def committed(self, name: str, rows: int, due: float) -> Callable[[Future], None]:
        def done(job: Future) -> None:
            if job.exception() is not None:
                return
            with self._lock:
                self.commits += 1
                self.written[name] += rows
                self.lag = max(0.0, time.time() - due)
                self.max_lag = max(self.max_lag, self.lag)

        return done


class Producer:
    """Writes the input tables (both streams, every partition) for one run id."""

    def __init__(self, lake: Lake, config: ProducerConfig) -> None:
        self.lake = lake
        self.config = config
        self.layout = Layout(config.partitions or 1)  # the lake's, once `run` reads it
        self.tables: dict[str, DeltaTable] = {}
        self.appenders: dict[str, TableAppender] = {}
        self.pools: dict[str, ThreadPoolExecutor] = {}
        self.checkpointers: dict[str, BackgroundCheckpointer] = {}
        self._failed = threading.Event()

    def _resume_state(self) -> tuple[dict[str, int], dict[str, int], int | None]:
        """Per table: next message index and next commit sequence; the run's start time."""
        next_index, next_seq, start_us = {}, {}, None
        for name, dt in self.tables.items():
            seq = dt.transaction_version(self.config.app_id)
            if seq is None:
                next_index[name], next_seq[name] = 0, 0
                continue
            next_seq[name] = seq + 1
            self._check_window(name, dt.transaction_version(f"{self.config.app_id}:window"))
            index = dt.transaction_version(f"{self.config.app_id}:next_index")
            start = dt.transaction_version(f"{self.config.app_id}:start_us")
            if index is not None and start is not None:
                next_index[name], start_us = index, start
                continue
            info = find_commit(
                dt, lambda c: meta(c, "producer.run_id") == self.config.run_id, limit=500
            )
            if info is None:  # marker without metadata: cannot happen for our commits
                raise ConfigError(f"table {name} has run {self.config.run_id} but no metadata")
            next_index[name] = int(meta(info, "producer.next_index"))
            start_us = int(meta(info, "producer.start_us"))
        return next_index, next_seq, start_us

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

    def _commit(
        self, name: str, batch: pa.Table, seq: int, hi: int, start_us: int, last: bool
    ) -> None:
        # Commits queued behind a failed one must not land: the log would then claim
        # messages up to `hi` while an earlier window is missing.
        if self._failed.is_set():
            raise RuntimeError(f"not committing {name} #{seq}: an earlier commit failed")
        try:
            self._append(name, batch, seq, hi, start_us, last)
        except BaseException:
            self._failed.set()
            raise

    def _append(
        self, name: str, batch: pa.Table, seq: int, hi: int, start_us: int, last: bool
    ) -> None:
        self.appenders[name].append_once(
            batch,
            app_id=self.config.app_id,
            seq=seq,
            custom_metadata=metadata(
                **{
                    "producer.run_id": self.config.run_id,
                    "producer.seq": seq,
                    "producer.next_index": hi,
                    "producer.start_us": start_us,
                    "producer.rate": self.config.rate,
                    "producer.finished": last,
                    "producer.total": self.config.total,
                }
            ),
            what=f"commit to {name}",
            checkpointer=self.checkpointers.get(name),
            markers={
                f"{self.config.app_id}:next_index": hi,
                f"{self.config.app_id}:start_us": start_us,
                f"{self.config.app_id}:window": self.config.window,
            },
        )

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
            found = delta_columns(dt.schema())
            if found != expected:
                raise StorageError(
                    f"table {name} at {self.lake.uri(name)} has columns ({show_columns(found)}), "
                    f"not the input contract ({show_columns(expected)}); nothing was written",
                    "point DELTABUS_PREFIX (or --prefix) at a deltabus lake, or move that "
                    "table away",
                )

    def run(
        self, on_progress: Callable[[dict], None] | None = None, progress_every_s: float = 5.0
    ) -> ProducerReport:
        """Produce the whole run. Every `progress_every_s` s `on_progress` gets the messages
        handed to the commit threads so far (a live display wants it often, a log rarely)."""
        self.layout = ensure_layout(self.lake, self.config.partitions)
        self.check_schemas()
        declare_inputs(self.lake, self.layout)
        for name in self.layout.input_tables:
            self.pools[name] = ThreadPoolExecutor(max_workers=1)
            self.tables[name] = retry_storage(
                lambda n=name: ensure_table(self.lake, n, INPUT_SCHEMA), what=f"open {name}"
            )
            self.checkpointers[name] = BackgroundCheckpointer(self.lake, name)
            self.appenders[name] = TableAppender(self.lake, name, self.tables[name])
        try:
            return self._run(on_progress, progress_every_s)
        finally:
            for checkpointer in self.checkpointers.values():
                checkpointer.close()

    def _run(
        self, on_progress: Callable[[dict], None] | None, progress_every_s: float
    ) -> ProducerReport:
        cfg = self.config
        next_index, next_seq, start_us = self._resume_state()
        tune_gc_for_streaming()
        resumed_from = min(next_index.values())
        finished = all(i >= cfg.total for i in next_index.values()) and resumed_from > 0
        wall_start = time.time()
        if start_us is None:
            start_us = cfg.start_us or int(wall_start * 1_000_000)
        start = start_us / 1_000_000
        if resumed_from:
            log.info("run %s resumes at message %d of %d", cfg.run_id, resumed_from, cfg.total)
        lo = resumed_from
        tables = self.layout.input_tables
        stats = _Progress(tables)
        last_progress = time.monotonic()
        per_window = cfg.window
        in_flight: dict[str, deque[Future]] = {name: deque() for name in tables}
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
            for name in tables:
                batch = batches[name]
                if next_index[name] >= hi and not last:
                    continue  # committed before a restart
                if batch.num_rows == 0 and not last:
                    continue
                queue = in_flight[name]
                # Commits of a table run in order on its own thread while the next window
                # is built; more than MAX_IN_FLIGHT waiting means storage is the bottleneck.
                while queue and (queue[0].done() or len(queue) >= MAX_IN_FLIGHT):
                    queue.popleft().result()
                seq = next_seq[name]
                next_seq[name] += 1
                job = self.pools[name].submit(self._commit, name, batch, seq, hi, start_us, last)
                job.add_done_callback(stats.committed(name, batch.num_rows, window_due))
                queue.append(job)
            lo = hi
            finished = last
            if on_progress and (time.monotonic() - last_progress >= progress_every_s or finished):
                last_progress = time.monotonic()
                on_progress({"messages": hi, "total": cfg.total, "lag_s": round(stats.lag, 3)})
        for queue in in_flight.values():
            while queue:
                queue.popleft().result()
        commits, written = stats.commits, stats.written
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
