"""The stream consumer: a group member reading the partitions its leases hold.

Each batch is one commit of one partition table: the stream's columns, `diff` (+1 a
record, -1 a record another writer's delete or update retracted), and where it came
from. The group's position per partition is the next version to read; `commit()`
stores what was returned so far, and with auto-commit each `poll` first commits what
the previous polls returned (at least once: a member that dies after a batch but before
its commit leaves that batch to the member that takes the partition).

A position below the oldest version the stream's retention keeps (deltabus.delta.retention)
is out of range, as in Kafka: the member moves it as `auto_offset_reset` says, with a
warning, or raises `OffsetOutOfRangeError`. It is checked when the member takes the
partition, after a `seek`, and when a data file a commit names is gone from storage.

A batch is handed out only while this member's lease on its partition runs for at least
`HANDOUT_MARGIN` of the lease time more (by the store's clock, deltabus.bus.groups);
otherwise the lease is renewed first, by a conditional write that fails when another
member took the partition meanwhile, and the batch is dropped with the partition. So a
member cut off from the store stops handing out records once its lease would have
ended (Kafka's session timeout), however long its reads took, and a member that took
the partition over is the only one that hands out what follows the committed position.

Rebalances call `on_assign`, `on_revoke` and `on_lost` as Kafka's `subscribe` listener
does. A partition given up in a rebalance is first revoked (`on_revoke`, where a
manual-commit application commits) and, with auto-commit, its position is committed
before it is released, so the next holder goes on after what polls returned.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from deltabus.bus.admin import position_at
from deltabus.bus.groups import DEFAULT_TTL_S, Group, Lease
from deltabus.bus.streams import Stream
from deltabus.bus.tail import DeltaLogTail
from deltabus.core import metrics
from deltabus.core.errors import ConfigError, OffsetOutOfRangeError, RemovedFileError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.retention import oldest_version
from deltabus.delta.snapshots import DeltaLog, parse_actions

log = logging.getLogger(__name__)
LAG_EXPORT_S = 5.0  # lag gauges are refreshed at most this often (a log listing each)

STARTS = ("beginning", "end")
# Kafka's `auto.offset.reset` for a position that fell behind the retention; the default
# is Kafka's.
AUTO_OFFSET_RESETS = ("earliest", "latest", "error")
DEFAULT_AUTO_OFFSET_RESET = "latest"
# A batch is handed out only while the lease runs for this share of the lease time more;
# it covers the error of the members' store-clock offsets (deltabus.bus.groups).
HANDOUT_MARGIN = 1 / 6


@dataclass(frozen=True, order=True)
class StreamPartition:
    """One partition of one stream (Kafka's TopicPartition)."""

    stream: str
    partition: int


# Called with the partitions assigned, revoked or lost in one rebalance.
RebalanceCallback = Callable[[list[StreamPartition]], None]


@dataclass(frozen=True)
class Batch:
    """The rows one commit of one partition changed."""

    stream: str
    partition: int
    version: int
    commit_ms: int
    rows: pa.Table  # the stream's columns and `diff` (int64: +1 or -1)


@dataclass
class _Held:
    """A partition this member holds: its lease, tail and the next version to read."""

    stream: Stream
    partition: int
    lease: Lease
    tail: DeltaLogTail
    next_version: int  # to read next: batches read end before it
    read_at_ms: int = 0  # commit timestamp of the newest batch returned
    # The oldest version retention keeps, to compare the position with before the next
    # read (None: checked).
    check: int | None = None
    # A batch read but not yet handed out: its lease is to be confirmed first.
    pending: Batch | None = None

    @property
    def returned(self) -> int:
        """The position after what was handed out: the position a commit stores."""
        return self.pending.version if self.pending is not None else self.next_version


class Consumer:
    """Reads streams as a member of consumer group `group`.

    Args:
        lake: the lake.
        streams: the declared streams to read.
        group: the group's name; groups read independently, members of one share.
        start: where a group that never read a partition starts: "beginning" (the oldest
            version retention keeps) or "end".
        auto_commit: commit what earlier polls returned at each poll.
        ttl_s: the lease time: a member silent this long loses its partitions.
        auto_offset_reset: a position below the oldest version retention keeps moves to
            it ("earliest") or past the newest version ("latest", Kafka's default), with
            a warning naming the partition, the position and the oldest version kept;
            or `poll` raises `OffsetOutOfRangeError` saying the same ("error") until the
            member `seek`s.
        on_assign: called with the partitions this member took, once it reads them.
        on_revoke: called with the partitions this member gives up in a rebalance (or at
            `close()`), before they are released: `commit()` inside it stores their
            positions. With auto-commit they are committed after it anyway.
        on_lost: called with the partitions whose lease another member wrote meanwhile
            (found at the next renewal or commit): no commit is possible for them.

    The callbacks run on the thread that rebalances (the member's heartbeat thread, or
    the thread that calls `close()`), with the consumer's lock held; an exception in one
    is raised by the next `poll()`.

    Iterate it for batches, or call `poll()`; `close()` (or the context manager) commits
    and leaves the group, whose other members then take its partitions at once.
    """

    def __init__(
        self,
        lake: Lake,
        streams: list[Stream],
        group: str,
        *,
        start: str = "beginning",
        auto_commit: bool = True,
        ttl_s: float = DEFAULT_TTL_S,
        member: str | None = None,
        auto_offset_reset: str = DEFAULT_AUTO_OFFSET_RESET,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        if start not in STARTS:
            raise ConfigError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
        if auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise ConfigError(
                f"auto_offset_reset must be one of {', '.join(AUTO_OFFSET_RESETS)}, got "
                f"{auto_offset_reset!r}"
            )
        self.auto_offset_reset = auto_offset_reset
        if not streams:
            raise ConfigError("a consumer reads at least one stream")
        self.lake = lake
        self.streams = {s.name: s for s in streams}
        self.group = Group(lake, group, ttl_s, member)
        self.start = start
        self.auto_commit = auto_commit
        self.ttl_s = ttl_s
        self.tables = {s.table(p): (s, p) for s in streams for p in range(s.partitions)}
        self.held: dict[str, _Held] = {}
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.on_lost = on_lost
        self._callback_error: BaseException | None = None
        self._paused: set[str] = set()
        # Per held table, the records of each version counted for the lag gauge.
        self._records: dict[str, dict[int, int]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._next = 0  # round robin over held partitions
        self._lag_exported = float("-inf")
        self._closed = False
        self._beat_due = 0.0  # monotonic time of the next heartbeat
        self._beat()
        self.rebalance()
        self._thread = threading.Thread(target=self._keep_alive, name="group", daemon=True)
        self._thread.start()

    @property
    def member(self) -> str:
        """This member's id in the group (host, pid and a random suffix)."""
        return self.group.member

    # -- membership -------------------------------------------------------------------------

    def _keep_alive(self) -> None:
        """The heartbeat thread: a heartbeat every ttl / 3 seconds, then a rebalance. A
        rebalance that waits for the consumer's lock (a read in progress) or takes several
        partitions (each a read of the table's state) goes on beating meanwhile, so its
        length does not make the others count this member gone."""
        while not self._stop.wait(max(0.0, self._beat_due - time.monotonic())):
            try:
                self._beat()
                self._rebalance(beat=True)
            except Exception as exc:  # noqa: BLE001 - an outage: leases may lapse, said
                log.warning("group %s: heartbeat failed (%s)", self.group.name, exc)

    def _beat(self) -> None:
        self.group.heartbeat()
        self._beat_due = time.monotonic() + self.ttl_s / 3

    def _beat_if_due(self, beat: bool) -> None:
        if beat and time.monotonic() >= self._beat_due:
            self._beat()

    def rebalance(self) -> None:
        """Take the partitions dealt to this member, revoke and release the others, renew
        leases that are half spent; call the rebalance callbacks for what changed."""
        self._rebalance(beat=False)

    def _rebalance(self, beat: bool) -> None:
        """`rebalance`; with `beat` (the heartbeat thread), heartbeats fall due meanwhile."""
        wanted = set(self.group.assigned(list(self.tables), self.group.live_members()))
        while not self._lock.acquire(timeout=self.ttl_s / 6):
            self._beat_if_due(beat)
        try:
            self._revoke(sorted(set(self.held) - wanted))
            taken = []
            for table in sorted(wanted - set(self.held)):
                self._beat_if_due(beat)
                if self._take(table):
                    taken.append(table)
            if taken:
                self._call(self.on_assign, taken)
            for table, held in list(self.held.items()):
                if held.lease.expires_ms - self.group.now_ms() < self.ttl_s * 500:
                    self._write(table, held.lease.position)
        finally:
            self._lock.release()

    def _sp(self, table: str) -> StreamPartition:
        stream, partition = self.tables[table]
        return StreamPartition(stream.name, partition)

    def _table(self, sp: StreamPartition) -> str:
        stream = self.streams.get(sp.stream)
        if stream is None or not 0 <= sp.partition < stream.partitions:
            raise ConfigError(
                f"{sp.stream} partition {sp.partition} is not read by this consumer",
                f"give one of the partitions of {', '.join(sorted(self.streams))}",
            )
        return stream.table(sp.partition)

    def _call(self, callback: RebalanceCallback | None, tables: Iterable[str]) -> None:
        """Run a rebalance callback; its exception is kept for the next poll."""
        if callback is None:
            return
        try:
            callback([self._sp(t) for t in tables])
        except Exception as exc:  # noqa: BLE001 - raised from the next poll
            self._callback_error = self._callback_error or exc

    def _revoke(self, tables: list[str]) -> None:
        """Give up `tables`: on_revoke, then (auto-commit) their positions, then release."""
        if not tables:
            return
        self._call(self.on_revoke, tables)
        for table in tables:
            held = self.held.get(table)
            if held is None:
                continue  # lost meanwhile (on_lost was called)
            if self.auto_commit and held.returned != held.lease.position:
                if not self._write(table, held.returned):
                    continue
            self._release(table)

    def _take(self, table: str) -> bool:
        stream, partition = self.tables[table]
        oldest = self._oldest(table)
        begin = oldest if self.start == "beginning" else self._latest(table) + 1
        lease = self.group.take(table, begin)
        if lease is None:
            return False
        tail = DeltaLogTail(self.lake, table, columns=stream.schema.names)
        at = max(lease.position, oldest)  # a position behind is moved before any read
        retry_storage(lambda: tail.start(at), what=f"read {table}'s state")
        self.held[table] = _Held(stream, partition, lease, tail, lease.position, check=oldest)
        log.info(
            "group %s: %s took %s at version %d",
            self.group.name,
            self.member,
            table,
            lease.position,
        )
        return True

    def _release(self, table: str) -> None:
        held = self.held.pop(table)
        self._paused.discard(table)
        self._records.pop(table, None)
        self.group.write(held.lease, table, None, held.lease.position)
        log.info("group %s: %s released %s", self.group.name, self.member, table)

    def _write(self, table: str, position: int) -> bool:
        """Write the partition's next revision (renewal or commit); False, and the
        partition dropped, when the lease was lost."""
        held = self.held[table]
        lease = self.group.write(held.lease, table, self.member, position)
        if lease is None:
            log.warning("group %s: %s lost its lease on %s", self.group.name, self.member, table)
            del self.held[table]
            self._paused.discard(table)
            self._records.pop(table, None)
            self._call(self.on_lost, [table])
            return False
        held.lease = lease
        return True

    def _latest(self, table: str) -> int:
        return retry_storage(lambda: self.lake.latest_version(table), what=f"list {table}'s log")

    def _oldest(self, table: str) -> int:
        """The oldest version of `table` retention keeps (0: all)."""
        return oldest_version(self.lake, table)

    def _check_position(self, table: str, held: _Held, oldest: int) -> None:
        """Apply `auto_offset_reset` when the next version to read is below `oldest`."""
        position = held.next_version
        if position >= oldest:
            held.check = None
            return
        dropped = (
            f"version {position}"
            if position == oldest - 1
            else f"versions {position} to {oldest - 1}"
        )
        facts = (
            f"group {self.group.name}: the position in partition {held.partition} of stream "
            f"{held.stream.name} (table {table}), version {position}, is below the oldest "
            f"version the stream's retention keeps, {oldest}: the records of {dropped} "
            "were dropped"
        )
        if self.auto_offset_reset == "error":
            held.check = oldest
            raise OffsetOutOfRangeError(
                facts,
                "seek the consumer (seek('beginning') reads on from the oldest version kept, "
                "seek('end') from what lands next), or consume with auto_offset_reset "
                "'earliest' or 'latest' (deltabus consume --auto-offset-reset); keep "
                "consumers within the stream's retention_s",
                table=table,
                position=position,
                oldest=oldest,
            )
        new = oldest if self.auto_offset_reset == "earliest" else self._latest(table) + 1
        log.warning(
            "%s; auto_offset_reset=%s: reading on from version %d",
            facts,
            self.auto_offset_reset,
            new,
        )
        retry_storage(lambda: held.tail.start(new), what=f"read {table}'s state")
        held.next_version = new
        held.check = None

    # -- reading ----------------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0) -> Batch | None:
        """The next batch of any held partition, waiting up to `timeout_s` for one.

        Returns:
            The rows one commit of one partition changed, with `diff` (+1 insert, -1
            retraction); None when no held partition had a new commit in time.

        Raises:
            StorageError: the lake failed past the retry budget.
        """
        deadline = time.monotonic() + timeout_s
        self._raise_callback_error()
        if self.auto_commit:
            self.commit()
        while True:
            batch = self._read_one()
            if batch is not None or time.monotonic() >= deadline:
                return batch
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _raise_callback_error(self) -> None:
        with self._lock:
            error, self._callback_error = self._callback_error, None
        if error is not None:
            raise error

    def _read_one(self) -> Batch | None:
        with self._lock:
            tables = sorted(set(self.held) - self._paused)
            for i in range(len(tables)):
                table = tables[(self._next + i) % len(tables)]
                held = self.held.get(table)
                if held is None:
                    continue  # lost while another partition's lease was confirmed
                batch = held.pending or self._read(table)
                if batch is None:
                    continue
                held.pending = batch
                if not self._owned(table):
                    continue  # lost: the batch is dropped with the partition
                held.pending = None
                self._next = (self._next + i + 1) % max(len(tables), 1)
                return batch
        return None

    def _owned(self, table: str) -> bool:
        """Whether this member may hand out a batch of `table` now: its lease runs for
        `HANDOUT_MARGIN` of the lease time more, or a renewal (a conditional write) shows
        no other member took the partition. False: lost, and dropped."""
        held = self.held[table]
        margin_ms = self.ttl_s * 1000 * HANDOUT_MARGIN
        if held.lease.expires_ms - self.group.now_ms() > margin_ms:
            return True
        return self._write(table, held.lease.position)

    def _read(self, table: str) -> Batch | None:
        held = self.held[table]
        if held.check is not None:
            self._check_position(table, held, held.check)
        while True:
            version = held.next_version
            commit = retry_storage(lambda v=version: held.tail.commit(v), what=f"poll {table}")
            if commit is None:
                return None
            try:
                rows = retry_storage(lambda c=commit: held.tail.rows(c), what=f"read {table}")
            except RemovedFileError:
                oldest = self._oldest(table)
                if version >= oldest:
                    raise  # gone, but not by retention: the error says what to do
                self._check_position(table, held, oldest)
                continue
            held.next_version = version + 1
            if rows is None:
                continue  # a commit that changed no rows (compaction, metadata)
            names = held.stream.schema.names
            data = rows.select([n for n in names if n in rows.column_names])
            data = data.append_column("diff", rows.column("_diff").cast(pa.int64()))
            held.read_at_ms = commit.timestamp_ms
            age_s = max(0.0, time.time() - commit.timestamp_ms / 1000)
            metrics.LATENCY.labels(metrics.component()).observe(age_s)
            return Batch(held.stream.name, held.partition, version, commit.timestamp_ms, data)

    def __iter__(self) -> Iterator[Batch]:
        while not self._closed:
            batch = self.poll()
            if batch is not None:
                yield batch

    # -- positions --------------------------------------------------------------------------

    def commit(self) -> None:
        """Store, per held partition, that every batch returned so far was read: a member
        that takes the partition over resumes after it. A partition whose lease was lost
        to another member is dropped, its position left to that member."""
        with self._lock:
            for table, held in list(self.held.items()):
                if held.returned != held.lease.position:
                    self._write(table, held.returned)
            self._export_lag()

    def _export_lag(self) -> None:
        """Set the lag gauges of the held partitions (one log listing each), when metrics
        are served and at most every LAG_EXPORT_S."""
        now = time.monotonic()
        if not metrics.served() or now - self._lag_exported < LAG_EXPORT_S:
            return
        self._lag_exported = now
        for table, held in self.held.items():
            latest = self._latest(table)
            behind = max(0, latest + 1 - held.lease.position)
            labels = (self.group.name, table)
            metrics.LAG_VERSIONS.labels(*labels).set(behind)
            metrics.LAG_RECORDS.labels(*labels).set(self._lag_records(table, held, latest))
            age = time.time() - held.read_at_ms / 1000 if behind and held.read_at_ms else 0.0
            metrics.LAG_SECONDS.labels(*labels).set(max(0.0, age))

    def _lag_records(self, table: str, held: _Held, latest: int) -> int:
        """The records in the versions from the committed position to `latest`, each log
        entry read once while the partition is held."""
        known = self._records.setdefault(table, {})
        for version in [v for v in known if v < held.lease.position]:
            del known[version]
        return records_between(self.lake, table, held.lease.position, latest, known)

    def seek(self, where: str | int | StreamPartition, version: str | int | None = None) -> None:
        """Read again from "beginning" (the oldest version retention keeps), from "end"
        (only what lands from now on) or from a version (below the oldest version kept:
        `auto_offset_reset` applies); stored at the next commit.

        `seek(where)` moves every held partition; `seek(StreamPartition(s, p), where)`
        moves that one, which this member must hold."""
        if isinstance(where, StreamPartition):
            if version is None:
                raise ConfigError("seek(partition, where) needs where", "e.g. seek(sp, 0)")
            with self._lock:
                self._seek_tables([self._held_table(where)], version)
            return
        with self._lock:
            self._seek_tables(list(self.held), where)

    def _held_table(self, sp: StreamPartition) -> str:
        table = self._table(sp)
        if table not in self.held:
            raise ConfigError(
                f"{sp.stream} partition {sp.partition} is not held by this member "
                f"(it holds {', '.join(str(self._sp(t)) for t in sorted(self.held)) or 'none'})",
                "act on the partitions of assignment(), or after on_assign",
            )
        return table

    def _seek_tables(self, tables: list[str], where: str | int) -> None:
        for table in tables:
            held = self.held[table]
            if where == "beginning":
                version = self._oldest(table)
            elif where == "end":
                version = self._latest(table) + 1
            elif isinstance(where, int) and where >= 0:
                version = where
            else:
                raise ConfigError(f"seek to 'beginning', 'end' or a version, got {where!r}")
            oldest = version if where == "beginning" else self._oldest(table)
            at = max(version, oldest)  # a version behind is moved before any read
            retry_storage(lambda h=held, v=at: h.tail.start(v), what=f"read {table}'s state")
            held.next_version = version
            held.pending = None
            held.check = oldest

    def seek_to_time(self, when: datetime | int) -> None:
        """Move every held partition to its first version committed at or after `when`
        (an aware datetime, or epoch ms), or past the newest when none is: Kafka's
        `offsets_for_times` then `seek`, by the commit timestamps of the Delta log."""
        if isinstance(when, int) and not isinstance(when, bool):
            when = datetime.fromtimestamp(when / 1000, tz=UTC)
        elif not isinstance(when, datetime) or when.tzinfo is None:
            raise ConfigError(
                f"seek_to_time needs an aware datetime or epoch milliseconds, got {when!r}",
                "e.g. datetime(2026, 11, 28, 6, tzinfo=UTC) or 1795845600000",
            )
        with self._lock:
            for table in list(self.held):
                self._seek_tables([table], position_at(self.lake, table, "datetime", when))

    def position(self, sp: StreamPartition) -> int:
        """The next version this member reads from a partition it holds."""
        with self._lock:
            return self.held[self._held_table(sp)].returned

    def committed(self, sp: StreamPartition) -> int | None:
        """The group's stored position in any partition (None: never read)."""
        table = self._table(sp)
        with self._lock:
            if table in self.held:
                return self.held[table].lease.position
        lease = self.group.lease(table)
        return None if lease is None else lease.position

    def pause(self, partitions: Iterable[StreamPartition]) -> None:
        """Stop returning batches of these held partitions (they stay held and renewed)."""
        with self._lock:
            self._paused.update(self._held_table(sp) for sp in partitions)

    def resume(self, partitions: Iterable[StreamPartition]) -> None:
        """Return batches of these partitions again."""
        with self._lock:
            self._paused.difference_update(self._table(sp) for sp in partitions)

    def paused(self) -> list[StreamPartition]:
        """The held partitions that are paused, sorted; a partition released or lost is
        no longer paused when taken again."""
        with self._lock:
            return sorted(self._sp(t) for t in self._paused if t in self.held)

    def lag(self) -> dict[str, int]:
        """Per held partition table: the versions landed that the group has not
        committed."""
        with self._lock:
            return {
                table: max(0, self._latest(table) + 1 - held.lease.position)
                for table, held in self.held.items()
            }

    def lag_records(self) -> dict[str, int]:
        """Per held partition table: the records landed in the versions the group has not
        committed (one GET of a log entry per version behind)."""
        with self._lock:
            return {
                table: self._lag_records(table, held, self._latest(table))
                for table, held in self.held.items()
            }

    def assigned(self) -> list[str]:
        """The partition tables this member holds now, sorted."""
        with self._lock:
            return sorted(self.held)

    def assignment(self) -> list[StreamPartition]:
        """The partitions this member holds now, sorted."""
        with self._lock:
            return sorted(self._sp(t) for t in self.held)

    def close(self) -> None:
        """Commit (with auto-commit), release every partition and leave the group."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        with self._lock:
            if self.auto_commit:
                self.commit()
            self._revoke(sorted(self.held))
        self.group.leave()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def records_between(
    lake: Lake, table: str, first: int, last: int, known: dict[int, int] | None = None
) -> int:
    """The records the commits `first`..`last` of `table` added (the `numRecords` of
    their data-changing adds), read from the log entries alone; 0 when first > last.

    Entries already cleaned from the log count nothing. `known` (version: records) is
    consulted first and filled, so a caller that counts again reads only new entries.
    """
    if first > last:
        return 0
    known = {} if known is None else known
    delta_log = DeltaLog(lake.object_store, table)

    def added(version: int) -> int:
        raw = retry_storage(lambda: delta_log.commit(version), what=f"read {table}'s log")
        adds = parse_actions(raw).get("add", []) if raw is not None else []
        return sum(
            int(json.loads(a["stats"]).get("numRecords", 0))
            for a in adds
            if a.get("dataChange", True) and a.get("stats")
        )

    missing = [v for v in range(first, last + 1) if v not in known]
    if missing:
        with ThreadPoolExecutor(max_workers=min(16, len(missing))) as pool:
            known.update(zip(missing, pool.map(added, missing), strict=True))
    return sum(known[v] for v in range(first, last + 1))
