"""Exactly-once consume-transform-produce between streams of equal partition counts.

Partition i of the output is written from partition i of every input, by one process.
Each output commit carries, as app transactions of the output table, the next version of
every input table it covers (`transform:<name>:<input table>`), so the rows and the
positions land together or not at all. A transform restarted after a crash reads those
positions back from the output table and goes on after them: every input commit is
transformed into the output exactly once, however often the process dies. The Pathway
ETL of the time-zone pipeline keeps its positions the same way.

A transform claims its output partition when it starts (deltabus.bus.fence), as the ETL
and Pathway links claim theirs: an older process of it still running stops with
`FencedError` at its next commit. `TransformGroup` runs a transform in replicas that
share the partitions by leases in the lake, as a consumer group's members do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from deltabus.bus.fence import FencedError
from deltabus.bus.groups import DEFAULT_TTL_S, Group, Membership, check_group
from deltabus.bus.streams import Stream
from deltabus.bus.tail import DeltaLogTail
from deltabus.bus.writers import open_writer
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.tables import metadata

log = logging.getLogger(__name__)

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")
FENCE_CHECK_S = 5.0  # an idle `run` checks this often whether a newer writer took over
STEP_COMMITS = 20  # input commits per input a `TransformGroup` transforms per step


@dataclass(frozen=True)
class Source:
    """Where a batch handed to the transform function comes from."""

    stream: str
    partition: int
    version: int


# rows: the input's columns and `diff` (+1 or -1); returns rows of the output's schema.
TransformFn = Callable[[pa.Table, Source], pa.Table | None]


class Transform:
    """Runs `fn` over one partition of the inputs into the same partition of `output`.

    Args:
        lake: the lake.
        name: the transform's stable name; its positions are kept under it.
        inputs: the streams read; each has the output's partition count.
        output: the stream written.
        partition: the partition this process runs.
        fn: called once per input commit with rows; what it returns is appended.
        fence: claim the output partition first, so that an older writer of it (this
            transform's, another transform's or a Pathway link's) still running stops
            with `FencedError` at its next commit; False leaves other writers be.

    `fn` must be a function of its arguments: an input commit whose output was not
    committed when the process died is transformed again. Opening a fenced transform
    makes every older one of its output partition stop at its next commit, so two
    processes of one (name, partition) never both commit.
    """

    def __init__(
        self,
        lake: Lake,
        name: str,
        inputs: list[Stream],
        output: Stream,
        partition: int,
        fn: TransformFn,
        *,
        fence: bool = True,
    ) -> None:
        if not name or not set(name) <= NAME_CHARS:
            raise ConfigError(
                f"transform name {name!r} is not usable",
                "use lower-case letters, digits, '_', '-' and '.'",
            )
        wrong = [s.name for s in inputs if s.partitions != output.partitions]
        if wrong or not inputs:
            raise ConfigError(
                f"transform {name}: inputs {', '.join(wrong) or '(none)'} do not have the "
                f"{output.partitions} partitions of {output.name}",
                "declare the output with the inputs' partition count",
            )
        if not 0 <= partition < output.partitions:
            raise ConfigError(f"partition must be 0..{output.partitions - 1}, got {partition}")
        self.lake = lake
        self.name = name
        self.output = output
        self.partition = partition
        self.fn = fn
        self.table = output.table(partition)
        writer = open_writer(
            lake, output, partition, claim_as=f"transform {name}" if fence else None
        )
        self.appender = writer.appender
        self.types = writer.types
        self.checkpointer = writer.checkpointer
        self.lease = writer.lease
        self.app_id = f"transform:{name}:p{partition}"
        self.seq = (self.appender.transaction_version(self.app_id) or 0) + 1
        self.tails: dict[str, tuple[Stream, DeltaLogTail]] = {}
        self.positions: dict[str, int] = {}  # input table -> next version to read
        for stream in inputs:
            table = stream.table(partition)
            tail = DeltaLogTail(lake, table, columns=stream.schema.names)
            position = self.appender.transaction_version(self._marker(table)) or 0
            retry_storage(lambda t=tail, p=position: t.start(p), what=f"read {table}'s state")
            self.tails[table] = (stream, tail)
            self.positions[table] = position
        self.commits = 0

    def _marker(self, table: str) -> str:
        return f"transform:{self.name}:{table}"

    def step(self, limit: int | None = None) -> int:
        """Transform the input commits that have landed (at most `limit` of each input;
        None: all), as one output commit; returns how many input commits it covered (0:
        nothing new).

        Raises:
            FencedError: a newer writer claimed the output partition; nothing of this
                step was written, and this transform must stop.
        """
        outputs: list[pa.Table] = []
        positions = dict(self.positions)
        for table, (stream, tail) in self.tails.items():
            while limit is None or positions[table] - self.positions[table] < limit:
                version = positions[table]
                commit = retry_storage(lambda t=tail, v=version: t.commit(v), what=f"poll {table}")
                if commit is None:
                    break
                rows = retry_storage(lambda t=tail, c=commit: t.rows(c), what=f"read {table}")
                positions[table] = version + 1
                if rows is None:
                    continue
                names = [n for n in stream.schema.names if n in rows.column_names]
                data = rows.select(names).append_column(
                    "diff", rows.column("_diff").cast(pa.int64())
                )
                out = self.fn(data, Source(stream.name, self.partition, version))
                if out is not None and out.num_rows:
                    outputs.append(self._fit(out))
        covered = sum(positions[t] - self.positions[t] for t in positions)
        if not covered:
            return 0
        if outputs:
            rows = pa.concat_tables(outputs)
            info: dict[str, object] = {"transform.name": self.name}
            if self.lease is not None:  # who wrote it: names the holder to a newer writer
                info.update({"etl.epoch": self.lease.epoch, "etl.owner": self.lease.owner})
            self.appender.append_once(
                rows,
                app_id=self.app_id,
                seq=self.seq,
                custom_metadata=metadata(**info),
                what=f"commit to {self.table}",
                checkpointer=self.checkpointer,
                markers={self._marker(t): v for t, v in positions.items()},
                fence=self.lease.check if self.lease is not None else None,
            )
            self.seq += 1
            self.commits += 1
        # Input commits that made no rows are not recorded: after a restart they are
        # transformed again, and again make none.
        self.positions = positions
        return covered

    def _fit(self, out: pa.Table) -> pa.Table:
        schema = self.output.schema
        try:
            return out.select(schema.names).cast(schema).cast(self.types)
        except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ConfigError(
                f"transform {self.name} returned rows that do not fit {self.output.name}: {exc}",
                f"return the columns {', '.join(schema.names)} with the output's types",
            ) from None

    def check_fence(self) -> None:
        """Raise `FencedError` when a newer writer has claimed the output partition (one
        GET per commit landed since this transform last looked; nothing when unfenced)."""
        lease, appender = self.lease, self.appender
        if lease is None:
            return

        def check() -> None:
            appender.refresh()
            lease.check(appender)

        retry_storage(check, what=f"check the writer of {self.table}")

    def run(self, stop: threading.Event, poll_interval_s: float = 0.1) -> None:
        """Step until `stop` is set, waiting `poll_interval_s` when nothing is new; an
        idle transform checks every `FENCE_CHECK_S` whether a newer writer took over.

        Raises:
            FencedError: a newer writer claimed the output partition.
        """
        checked = time.monotonic()
        try:
            while not stop.is_set():
                if self.step():
                    checked = time.monotonic()
                    continue
                if time.monotonic() - checked >= FENCE_CHECK_S:
                    self.check_fence()
                    checked = time.monotonic()
                stop.wait(poll_interval_s)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the output's checkpointer (it finishes the checkpoint it is writing)."""
        self.checkpointer.close()


class TransformGroup:
    """One replica of transform `name`: any number of replicas, on any hosts and with no
    identity, share the output's partitions by leases in the lake.

    Args:
        lake: the lake.
        name: the transform's stable name; the replicas are the members of the group
            `transform.<name>` (deltabus.bus.groups).
        inputs, output, fn: as `Transform`'s.
        ttl_s: a replica not heard from for this long loses its partitions to the others.

    A replica takes the partitions the group deals it when they are free or their lease
    has ended, and runs a fenced `Transform` of each; the `Transform` claims the output
    partition and resumes from the positions committed in it, so a partition moved from a
    dead, stalled or departed replica is transformed exactly once. A partition dealt to
    another replica is given up between two steps, then released; one whose lease is
    lost (or whose output a newer writer claimed) is dropped at once.
    """

    def __init__(
        self,
        lake: Lake,
        name: str,
        inputs: list[Stream],
        output: Stream,
        fn: TransformFn,
        *,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.lake = lake
        self.name = name
        self.inputs = inputs
        self.output = output
        self.fn = fn
        self.group = check_group(f"transform.{name}")
        self.membership = Membership(Group(lake, self.group, ttl_s), output.tables)
        self.running: dict[str, Transform] = {}  # output partition table -> its transform

    @property
    def member(self) -> str:
        """This replica's member id in the group."""
        return self.membership.member

    @property
    def held(self) -> list[int]:
        """The output partitions this replica transforms now, in order."""
        return sorted(self.output.tables.index(t) for t in self.running)

    def run(self, stop: threading.Event, poll_interval_s: float = 0.1) -> None:
        """Hold partitions and transform them until `stop` is set; then release every
        lease and leave the group, so the others take over at their next step.

        Raises:
            ConfigError, StorageError: as `Transform` raises them (the replica's leases
                then end by themselves, and the others take its partitions).
        """
        log.info(
            "transform %s: replica %s joins group %s (%d partitions)",
            self.name,
            self.member,
            self.group,
            self.output.partitions,
        )
        # Heartbeat first and deal one step later: replicas started together see each
        # other before taking, and move no partition twice.
        self.membership.heartbeat()
        next_step = time.monotonic() + self.membership.tick_s
        try:
            while not stop.is_set():
                if time.monotonic() >= next_step:
                    self.step_group()
                    next_step = time.monotonic() + self.membership.tick_s
                if not self.step_partitions() and not stop.is_set():
                    stop.wait(min(poll_interval_s, max(0.0, next_step - time.monotonic())))
        finally:
            self.leave()

    def step_group(self) -> None:
        """One step of the membership: heartbeat, take what is dealt to this replica and
        free, renew, drop what was lost and give up what is dealt to others."""
        try:
            changes = self.membership.step()
        except Exception as exc:  # noqa: BLE001 - an outage: leases lapse by the clock
            log.warning("group %s: step failed (%s); retrying", self.group, exc)
            return
        for table in changes.lost:
            self._drop(table, "its lease was lost")
        for table in changes.unwanted:
            self._drop(table, "it is dealt to another replica")
            self.membership.release(table)
        for table in changes.taken:
            partition = self.output.tables.index(table)
            self.running[table] = Transform(
                self.lake, self.name, self.inputs, self.output, partition, self.fn
            )
            log.info("transform %s: %s runs partition %d", self.name, self.member, partition)

    def step_partitions(self) -> int:
        """Step every held partition once (at most `STEP_COMMITS` commits of each input);
        returns the input commits covered."""
        covered = 0
        now_ms = self.membership.group.now_ms()
        for table, transform in list(self.running.items()):
            lease = self.membership.held.get(table)
            if lease is None or lease.expires_ms <= now_ms:
                self.membership.held.pop(table, None)
                self._drop(table, "its lease ended before a renewal landed")
                continue
            try:
                covered += transform.step(STEP_COMMITS)
            except FencedError as exc:
                log.warning("transform %s: %s", self.name, exc.problem)
                self._drop(table, "a newer writer claimed it")
                self.membership.release(table)
        return covered

    def _drop(self, table: str, why: str) -> None:
        transform = self.running.pop(table, None)
        if transform is not None:
            transform.close()
            log.info(
                "transform %s: %s stopped partition %d: %s",
                self.name,
                self.member,
                transform.partition,
                why,
            )

    def leave(self) -> None:
        """Stop every partition, release the leases and leave the group."""
        for table in list(self.running):
            self._drop(table, "the replica is leaving")
        self.membership.leave()
        log.info("transform %s: replica %s left group %s", self.name, self.member, self.group)
