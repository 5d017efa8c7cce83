"""The stream producer: records in, one Delta commit per partition per flush.

Records of a producer are numbered from 0 in the order they are sent: its offsets. A
flush commits the records sent since the last flush, at most one commit per partition,
all partitions at once. Every commit carries the producer's app transaction, the offset
the flush ends at, with two markers: the offset it started at and how many partitions it
wrote. On open, the partitions' transactions tell how far the producer got: the last
flush counts only when all its partitions have it (`committed`). A producer restarted
with the same id sends again from `committed`, in the same order with the same keys, and
a record a partition already holds is dropped there, so every record lands exactly once.

A record's partition is a function of its key (the stream's partitioner: CRC-32 of its
UTF-8 text, or Kafka's murmur2, modulo the partition count) or, with no key, of its
offset (spans of STICKY_SPAN records go to one partition, then the next), so a resent
record goes where it went before.

One process at a time holds a producer id: opening a producer claims the next epoch of
its id in every partition (an empty commit with the app transaction `<app id>:epoch`),
and a producer whose next commit meets a newer epoch stops with `FencedError`, as an ETL
does (deltabus.bus.fence).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from deltabus.bus.fence import FencedError
from deltabus.bus.partitioning import key_partition
from deltabus.bus.streams import Stream, show_schema
from deltabus.bus.writers import close_writers, open_writers
from deltabus.core import metrics
from deltabus.core.errors import BufferFullError as BufferFullError
from deltabus.core.errors import ConfigError
from deltabus.core.errors import RecordError as RecordError
from deltabus.core.intervals import check_interval
from deltabus.delta.append import TableAppender
from deltabus.delta.lake import Lake
from deltabus.delta.tables import app_transactions, metadata

log = logging.getLogger(__name__)

STICKY_SPAN = 16_384  # records per partition in turn when records have no key
DEFAULT_COMMIT_INTERVAL_MS = 100
# Records queued or being committed before `send` blocks (Kafka's buffer.memory), and how
# long it blocks before it raises (Kafka's max.block.ms).
DEFAULT_MAX_BUFFERED_RECORDS = 1_000_000
DEFAULT_MAX_BLOCK_S = 60.0
PRODUCER_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")
OWN_METADATA = frozenset({"producer.id", "producer.end", "producer.epoch", "producer.owner"})
# Called once per `send` / `send_batch` when its records are committed (error None) or
# failed: (offset of its first record, the error).
DeliveryCallback = Callable[[int, BaseException | None], None]


PRODUCER_APP_PREFIX = "deltabus-stream-producer:"  # + producer id: its app transactions


@dataclass(frozen=True)
class FlushMark:
    """What one partition holds of a producer: the flush end, start and width."""

    end: int
    start: int
    parts: int


class Producer:
    """Sends records to one stream, exactly once per producer id across restarts.

    Args:
        lake: the lake.
        stream: the declared stream.
        producer_id: the producer's stable name (letters, digits, '_', '-', '.'); a
            restart with the same id continues its offsets.
        commit_interval_ms: the longest a sent record waits for its commit, flushed by a
            background thread (0: only `flush()` and `close()` commit).
        max_buffered_records: records queued or being committed past which `send`
            blocks (a batch larger than it is taken when nothing else is buffered).
        max_block_s: how long `send` blocks for room before it raises `BufferFullError`.

    Use as a context manager, or call `close()`: both flush what is pending. Opening a
    producer fences every older producer of the same id: its next commit raises
    `FencedError`. `send` never waits for storage, only for room in the buffer.

    Example:
        `with Producer(lake, stream, "checkout-1") as p: p.send({"order_id": 1, ...})`
    """

    def __init__(
        self,
        lake: Lake,
        stream: Stream,
        producer_id: str,
        commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
        *,
        max_buffered_records: int = DEFAULT_MAX_BUFFERED_RECORDS,
        max_block_s: float = DEFAULT_MAX_BLOCK_S,
    ) -> None:
        if max_buffered_records < 1 or max_block_s < 0:
            raise ConfigError(
                "max_buffered_records must be at least 1 and max_block_s at least 0, got "
                f"{max_buffered_records} and {max_block_s}"
            )
        if not producer_id or not set(producer_id) <= PRODUCER_ID_CHARS:
            raise ConfigError(
                f"producer id {producer_id!r} is not usable",
                "use lower-case letters, digits, '_', '-' and '.'",
            )
        if commit_interval_ms:
            check_interval(commit_interval_ms / 1000, "commit interval")
        self.lake = lake
        self.stream = stream
        self.producer_id = producer_id
        self.app_id = f"{PRODUCER_APP_PREFIX}{producer_id}"
        self.epoch_app_id = f"{self.app_id}:epoch"
        self.interval_s = commit_interval_ms / 1000
        self.max_buffered_records = max_buffered_records
        self.max_block_s = max_block_s
        # `_lock` guards the queue and is never held through storage I/O; `_flushing`
        # makes flushes one at a time. `_room` wakes senders blocked on a full buffer.
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._flushing = threading.Lock()
        self._pending: list[pa.Table] = []  # validated batches, in send order
        self._pending_keys: list[np.ndarray] = []  # their partitions
        self._pending_callbacks: list[tuple[int, DeliveryCallback]] = []
        self._buffered = 0  # records queued or being committed
        self._oldest: float | None = None  # monotonic time of the oldest pending record
        self._failure: BaseException | None = None
        self._closed = False
        self.writers = open_writers(lake, stream)
        self.appenders = [w.appender for w in self.writers]
        self.checkpointers = [w.checkpointer for w in self.writers]
        self.types = self.writers[0].types
        self.epoch = self._claim()
        self.marks = [self._mark(a) for a in self.appenders]
        self.committed = _resume_offset(self.marks)
        self.next_offset = self.committed  # the offset the next record sent gets
        self.commits = 0
        self._pool = ThreadPoolExecutor(max_workers=min(stream.partitions, 8))
        self._stop = threading.Event()
        self._wake = threading.Event()  # a full buffer asks the flusher to flush now
        self._flusher: threading.Thread | None = None
        if self.interval_s > 0:
            self._flusher = threading.Thread(
                target=self._flush_when_due, name=f"flush-{stream.name}", daemon=True
            )
            self._flusher.start()

    # -- opening ----------------------------------------------------------------------------

    def _claim(self) -> int:
        """Claim the next epoch of this producer id in every partition, partition 0 first
        (so of two producers opening at once, the one that claims partition 0 wins)."""
        epoch = 1 + max((a.transaction_version(self.epoch_app_id) or 0) for a in self.appenders)
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        for p, appender in enumerate(self.appenders):
            landed = appender.append_once(
                self.types.empty_table(),
                app_id=self.epoch_app_id,
                seq=epoch,
                custom_metadata=metadata(
                    **{"producer.id": self.producer_id, "producer.epoch": epoch},
                    **{"producer.owner": owner},
                ),
                what=f"claim {self.stream.table(p)} for producer {self.producer_id}",
                checkpointer=self.checkpointers[p],
                fence=self._fence(epoch),
            )
            if not landed:
                raise self._fenced(epoch)
        return epoch

    def _fence(self, epoch: int) -> Callable[[Any], None]:
        """The check a commit makes on every retry: no newer epoch of this id landed."""

        def check(handle: Any) -> None:
            if (handle.transaction_version(self.epoch_app_id) or 0) > epoch:
                raise self._fenced(epoch)

        return check

    def _fenced(self, epoch: int) -> FencedError:
        metrics.FENCED.labels(metrics.component()).inc()
        return FencedError(
            f"another producer with id {self.producer_id} opened stream {self.stream.name} "
            f"after this one (epoch {epoch}): this one stopped; what it had not committed "
            "the newer one sends again",
            "run one producer per producer id: stop the other one, or let this one go",
        )

    def _mark(self, appender: TableAppender) -> FlushMark | None:
        end = appender.transaction_version(self.app_id)
        if end is None:
            return None
        start = appender.transaction_version(f"{self.app_id}:start")
        parts = appender.transaction_version(f"{self.app_id}:parts")
        return FlushMark(end, start if start is not None else end, parts or 1)

    # -- sending ----------------------------------------------------------------------------

    def send(
        self,
        record: Mapping[str, Any],
        key: object = None,
        *,
        on_delivery: DeliveryCallback | None = None,
    ) -> int:
        """Queue one record; returns its offset. `key` (else the stream's key column)
        picks its partition; `on_delivery(offset, error)` is called once it is committed
        (error None) or has failed, from the flushing thread.

        Raises:
            RecordError: the record does not fit the schema; nothing is queued.
            BufferFullError: the buffer stayed full for `max_block_s`.
            FencedError: a newer producer of this id took over.
        """
        self._check_columns(list(record))
        batch = self._validated(lambda: pa.Table.from_pylist([dict(record)], self.stream.schema))
        if key is None and self.stream.key is not None:
            key = record.get(self.stream.key)
            if key is None:
                raise RecordError(
                    f"a record of stream {self.stream.name} has no key: its key column "
                    f"{self.stream.key} is empty",
                    f"give {self.stream.key} a value, or pass key=...",
                )
        return self._queue(batch, None if key is None else [key], on_delivery=on_delivery)

    def send_batch(
        self,
        batch: pa.Table,
        keys: Iterable[object] | None = None,
        *,
        partitions: np.ndarray | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> int:
        """Queue the rows of an Arrow table, in order; returns the first one's offset.
        `keys` (one per row; else the stream's key column) pick their partitions, or
        `partitions` gives each row's partition itself (a writer with its own
        partitioner; it must give a resent row the partition it gave it before).

        `on_delivery(first offset, error)` is called once, when the rows are committed
        or have failed.

        Raises:
            RecordError: the rows do not fit the schema, `keys` or `partitions` has
                another length, or a partition is out of range; nothing is queued.
            BufferFullError: the buffer stayed full for `max_block_s`.
        """
        self._check_columns(batch.column_names)
        schema = self.stream.schema
        typed = batch.schema.equals(self.types)  # as the tables hold it: nothing to convert
        table = self._validated(lambda: batch if typed else batch.select(schema.names).cast(schema))
        if partitions is not None:
            parts = self._checked_partitions(partitions, table.num_rows)
            return self._queue(table, None, parts, on_delivery=on_delivery)
        if keys is None and self.stream.key is not None:
            keys = table.column(self.stream.key).to_pylist()
        keyed = None if keys is None else list(keys)
        if keyed is not None and len(keyed) != table.num_rows:
            raise RecordError(
                f"{len(keyed)} keys for {table.num_rows} rows of stream {self.stream.name}",
                "give one key per row, or none",
            )
        return self._queue(table, keyed, on_delivery=on_delivery)

    def _checked_partitions(self, partitions: np.ndarray, rows: int) -> np.ndarray:
        parts = np.asarray(partitions, dtype=np.int64)
        count = self.stream.partitions
        if parts.shape != (rows,) or (rows and (parts.min() < 0 or parts.max() >= count)):
            raise RecordError(
                f"partitions for {rows} rows of stream {self.stream.name} must be {rows} "
                f"numbers in 0..{count - 1}",
                "give one partition per row, or keys",
            )
        return parts

    def _check_columns(self, names: list[str]) -> None:
        schema = self.stream.schema
        unknown = sorted(set(names) - set(schema.names))
        missing = [f.name for f in schema if not f.nullable and f.name not in names]
        if unknown or missing:
            raise RecordError(
                f"a record does not fit stream {self.stream.name}: "
                + "; ".join(
                    part
                    for part in (
                        f"unknown columns {', '.join(unknown)}" if unknown else "",
                        f"missing required columns {', '.join(missing)}" if missing else "",
                    )
                    if part
                ),
                f"send the columns of its schema: {show_schema(schema)}",
            )

    def _validated(self, convert: Any) -> pa.Table:
        """`convert()` in the stream's schema, cast to the tables' types (unless it has
        them already), with no null in a required column."""
        schema = self.stream.schema
        try:
            table = convert()
            if not table.schema.equals(self.types):
                table = table.cast(self.types)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise RecordError(
                f"a record does not fit stream {self.stream.name}: {exc}",
                f"send the columns of its schema: {show_schema(schema)}",
            ) from None
        nulls = [f.name for f in schema if not f.nullable and table.column(f.name).null_count]
        if nulls:
            raise RecordError(
                f"a record of stream {self.stream.name} has no value for required column "
                f"{', '.join(nulls)}",
                f"send the columns of its schema: {show_schema(schema)}",
            )
        return table

    def _queue(
        self,
        table: pa.Table,
        keys: list[object] | None,
        parts: np.ndarray | None = None,
        *,
        on_delivery: DeliveryCallback | None = None,
    ) -> int:
        if parts is None:
            parts = self._partitions_of(keys, table.num_rows)
        rows = table.num_rows
        deadline = time.monotonic() + self.max_block_s
        with self._room:
            while True:
                self._raise_failure()
                if self._closed:
                    raise ConfigError(f"the producer of {self.stream.name} is closed")
                if not self._buffered or self._buffered + rows <= self.max_buffered_records:
                    break
                self._wake.set()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BufferFullError(
                        f"the producer of {self.stream.name} holds {self._buffered} records "
                        f"not yet committed (max_buffered_records {self.max_buffered_records}) "
                        f"and had no room for {rows} more in {self.max_block_s:g} s",
                        "flush more often (a shorter commit interval), send less at once, or "
                        "raise max_buffered_records / max_block_s; check that the store "
                        "keeps up",
                    )
                self._room.wait(left)
            first = self.next_offset
            self._pending.append(table)
            self._pending_keys.append(self._sticky(first, rows) if parts is _STICKY else parts)
            if on_delivery is not None:
                self._pending_callbacks.append((first, on_delivery))
            self.next_offset += rows
            self._buffered += rows
            if self._oldest is None:
                self._oldest = time.monotonic()
            return first

    def _partitions_of(self, keys: list[object] | None, rows: int) -> np.ndarray:
        """The partitions of `rows` records with `keys`; `_STICKY` for records without
        keys, whose partitions follow from their offsets once queued."""
        if keys is None:
            return _STICKY
        if any(k is None for k in keys):
            raise RecordError(
                f"a record of stream {self.stream.name} has no key",
                "give every record a key, or none of them",
            )
        hashing = self.stream.partitioner
        return np.array(
            [key_partition(k, self.stream.partitions, hashing) for k in keys], dtype=np.int64
        )

    def _sticky(self, first: int, rows: int) -> np.ndarray:
        """Partitions of keyless records at offsets first..first+rows: sticky spans."""
        offsets = np.arange(first, first + rows, dtype=np.int64)
        spans = offsets // STICKY_SPAN + zlib.crc32(self.producer_id.encode())
        return spans % self.stream.partitions

    # -- committing -------------------------------------------------------------------------

    def flush(
        self,
        metadata: Mapping[str, object] | None = None,
        marks: Mapping[str, int] | None = None,
        *,
        everywhere: bool = False,
    ) -> int:
        """Commit every record queued when it starts (sends go on meanwhile); returns
        `committed`, the offset after the last record that is durable.

        Args:
            metadata: commit metadata of this flush's commits, JSON values under the
                `deltabus.` prefix (e.g. {"producer.run": "r1"} is `deltabus.producer.run`);
                the producer's own keys (`producer.id`, `.end`, `.epoch`, `.owner`) are taken.
            marks: integers committed atomically with the records, as app transactions
                that outlive the log files (read back with `mark`).
            everywhere: commit to every partition, with no rows where none is queued (a
                marker that every reader of every partition sees, e.g. the end of a run).

        Raises:
            ConfigError: `metadata` names one of the producer's own keys.
            StorageError: the lake failed past the retry budget; their delivery callbacks
                get the error, and the producer refuses further sends (reopen it to go
                on: it resumes from `committed`).
            FencedError: a newer producer of this id took over.
        """
        info = dict(metadata or {})
        taken = sorted(set(info) & OWN_METADATA)
        if taken:
            raise ConfigError(
                f"commit metadata {', '.join(taken)} is the producer's own", "use other keys"
            )
        with self._flushing:
            with self._lock:  # take the queue; sends go on while it commits
                self._raise_failure()
                if not self._pending and not everywhere:
                    return self.committed
                tables, keys, callbacks = (
                    self._pending,
                    self._pending_keys,
                    self._pending_callbacks,
                )
                self._pending, self._pending_keys, self._pending_callbacks = [], [], []
                self._oldest = None
                start, end = self.committed, self.next_offset
            try:
                writes = self._partition_writes(tables, keys, start, end, everywhere)
                if len(writes) == 1:  # one partition: no hand-off to the pool
                    p, batch = writes[0]
                    self._commit(p, batch, start, end, 1, info, marks or {})
                else:
                    futures = [
                        self._pool.submit(
                            self._commit, p, batch, start, end, len(writes), info, marks or {}
                        )
                        for p, batch in writes
                    ]
                    for future in futures:
                        future.result()
            except BaseException as exc:
                with self._room:
                    self._failure = exc
                    self._room.notify_all()
                _deliver(callbacks, exc)
                raise
            with self._room:
                for p, _ in writes:
                    self.marks[p] = FlushMark(end, start, len(writes))
                self.committed = end
                self._buffered -= end - start
                self._room.notify_all()
            _deliver(callbacks, None)
            return end

    def _partition_writes(
        self,
        tables: list[pa.Table],
        keys: list[np.ndarray],
        start: int,
        end: int,
        everywhere: bool,
    ) -> list[tuple[int, pa.Table]]:
        """(partition, rows) per partition the records at offsets start..end go to,
        without those a partition holds already (resent after a restart); every
        partition if `everywhere`. Records that all go to one partition are not copied."""
        rows = pa.concat_tables(tables) if tables else self.types.empty_table()
        parts = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        counts = np.bincount(parts, minlength=self.stream.partitions)
        targets = range(self.stream.partitions) if everywhere else np.flatnonzero(counts).tolist()
        writes = []
        for p in targets:
            mark = self.marks[p]
            resent = mark is not None and mark.end > start  # holds some of them
            if counts[p] == len(parts) and len(parts) and not resent:
                writes.append((p, rows))
                continue
            mask = parts == p
            if resent:
                offsets = np.arange(start, end, dtype=np.int64)
                mask &= offsets >= mark.end
            if mask.any() or everywhere:
                writes.append((p, rows.filter(pa.array(mask))))
        return writes

    def _commit(
        self,
        p: int,
        batch: pa.Table,
        start: int,
        end: int,
        parts: int,
        info: dict[str, object],
        marks: Mapping[str, int],
    ) -> None:
        self.appenders[p].append_once(
            batch,
            app_id=self.app_id,
            seq=end,
            custom_metadata=metadata(
                **info, **{"producer.id": self.producer_id, "producer.end": end}
            ),
            what=f"commit to {self.stream.table(p)}",
            checkpointer=self.checkpointers[p],
            fence=self._fence(self.epoch),
            markers={
                f"{self.app_id}:start": start,
                f"{self.app_id}:parts": parts,
                **{f"{self.app_id}:mark:{name}": value for name, value in marks.items()},
            },
        )
        self.commits += 1

    def mark(self, name: str) -> int | None:
        """The value of mark `name` that the newest flush recorded (None: never recorded).

        A flush cut short between partitions leaves the newest flush's marks on some
        partitions, and `committed` before it: record values that are the same in every
        flush, or that tell where the flush started as well as where it ended.
        """
        held = [(m.end, p) for p, m in enumerate(self.marks) if m is not None]
        if not held:
            return None
        _, newest = max(held)
        return self.appenders[newest].transaction_version(f"{self.app_id}:mark:{name}")

    def _flush_when_due(self) -> None:
        while not self._stop.is_set():
            full = self._wake.wait(self.interval_s / 4)
            self._wake.clear()
            oldest = self._oldest
            if self._stop.is_set() or oldest is None:
                continue
            if not full and time.monotonic() - oldest < self.interval_s:
                continue
            try:
                self.flush()
            except BaseException:  # noqa: BLE001 - kept, and raised at the next call
                return

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        """Flush, then stop the background threads. Safe to call twice."""
        if self._closed:
            return
        self._stop.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self.flush()
        finally:
            self._closed = True
            self._pool.shutdown(wait=True)
            close_writers(self.writers)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# `_partitions_of` for keyless records: their partitions follow from their offsets.
_STICKY = np.zeros(0, np.int64)


def _deliver(callbacks: list[tuple[int, DeliveryCallback]], error: BaseException | None) -> None:
    """Tell each send's callback its outcome; a callback that raises is logged."""
    for first, callback in callbacks:
        try:
            callback(first, error)
        except Exception:  # noqa: BLE001 - the application's bug must not stop the producer
            log.exception("a delivery callback raised (offset %d)", first)


def _resume_offset(marks: list[FlushMark | None]) -> int:
    """The offset after the last record every partition it went to holds: the newest
    flush's end when all the partitions it wrote have it, else where it started."""
    held = [m for m in marks if m is not None]
    if not held:
        return 0
    newest = max(m.end for m in held)
    last = [m for m in held if m.end == newest]
    return newest if len(last) >= last[0].parts else last[0].start


def recorded_marks(lake: Lake, table: str, name: str) -> dict[str, int]:
    """Per producer id, the value of mark `name` its newest flush to partition table
    `table` recorded (`Producer.flush(marks=...)`).

    Marks are app transactions, which checkpoints keep: log cleanup never hides one, as
    it hides commit metadata."""
    suffix = f":mark:{name}"
    return {
        app[len(PRODUCER_APP_PREFIX) : -len(suffix)]: version
        for app, version in app_transactions(lake, table).items()
        if app.startswith(PRODUCER_APP_PREFIX) and app.endswith(suffix)
    }
