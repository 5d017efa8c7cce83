"""`deltabus.connect()`: one lake, and the streams, producers and consumers on it."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

from deltabus.bus import admin
from deltabus.bus.consumer import (
    DEFAULT_AUTO_OFFSET_RESET,
    Consumer,
    RebalanceCallback,
    records_between,
)
from deltabus.bus.fence import describe_owner, lease_holder
from deltabus.bus.groups import DEFAULT_TTL_S, Group, list_groups
from deltabus.bus.maintenance import StreamMaintenance, maintain_streams
from deltabus.bus.partitioning import Partitioner
from deltabus.bus.producer import (
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_MAX_BLOCK_S,
    DEFAULT_MAX_BUFFERED_RECORDS,
    Producer,
)
from deltabus.bus.streams import (
    Stream,
    StreamSettings,
    alter_stream,
    create_stream,
    get_stream,
    list_streams,
)
from deltabus.bus.transform import Transform, TransformFn, TransformGroup
from deltabus.core.settings import load_settings
from deltabus.delta.lake import Lake


class Bus:
    """A lake seen as a set of streams. Made by `connect()`.

    Example:
        ```python
        bus = deltabus.connect()
        bus.create_stream("orders", schema, partitions=4, key="customer")
        with bus.producer("orders", "checkout-1") as producer:
            producer.send({"order_id": 1, "amount": 9.5, "ts": now, "customer": "ada"})
        with bus.consumer("orders", group="billing") as consumer:
            for batch in consumer:
                bill(batch.rows)
        ```
    """

    def __init__(self, lake: Lake) -> None:
        self.lake = lake

    def create_stream(
        self,
        name: str,
        schema: pa.Schema,
        *,
        partitions: int = 1,
        key: str | None = None,
        settings: StreamSettings | None = None,
        partitioner: Partitioner = "crc32",
    ) -> Stream:
        """Declare stream `name` and create its partition tables; idempotent.

        Args and the rules of a second declaration (additive schema evolution only; the
        partition count, key and partitioner are fixed):
        `deltabus.bus.streams.create_stream`.

        Returns:
            The stream as recorded.

        Raises:
            ConfigError: another declaration of `name` is recorded; nothing changes.
        """
        return create_stream(
            self.lake,
            name,
            schema,
            partitions=partitions,
            key=key,
            settings=settings,
            partitioner=partitioner,
        )

    def alter_stream(self, name: str, **settings: Any) -> Stream:
        """Change settings of declared stream `name` (fields of `StreamSettings`, e.g.
        `retention_s=86400`; None: the default, e.g. no retention); the rest of the
        declaration stays (deltabus.bus.streams.alter_stream).

        Returns:
            The stream as recorded afterwards.

        Raises:
            ConfigError: no such stream, or a setting is unknown or invalid.
        """
        return alter_stream(self.lake, name, **settings)

    def maintain(
        self, name: str | None = None, *, vacuum_retention_hours: float | None = None
    ) -> list[StreamMaintenance]:
        """Maintain every declared stream, or stream `name`: per partition table, drop the
        records past the stream's retention, compact (when its `compaction` setting is
        on), checkpoint, clean up expired log files and vacuum (deltabus.bus.maintenance).

        Args:
            name: one declared stream (None: all of them).
            vacuum_retention_hours: vacuum deletes removed files older than this (None:
                each table's deleted-file retention, `DELTABUS_DELETED_FILE_RETENTION_S`
                or Delta's week).

        Returns:
            Per stream, what each of its tables' pass did (`.as_dict()` for JSON).

        Raises:
            ConfigError: `name` is not a declared stream.
        """
        names = [name] if name is not None else self.streams()
        streams = [self.stream(n) for n in names]
        return maintain_streams(self.lake, streams, vacuum_retention_hours)

    def stream(self, name: str) -> Stream:
        """The declared stream `name`.

        Raises:
            ConfigError: no stream of that name is declared (the message names those that
                are).
        """
        return get_stream(self.lake, name)

    def streams(self) -> list[str]:
        """The names of the declared streams, sorted."""
        return list_streams(self.lake)

    def producer(
        self,
        stream: str,
        producer_id: str,
        commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
        *,
        max_buffered_records: int = DEFAULT_MAX_BUFFERED_RECORDS,
        max_block_s: float = DEFAULT_MAX_BLOCK_S,
    ) -> Producer:
        """A producer of `stream`, exactly once per `producer_id` across restarts.

        Args:
            stream: a declared stream.
            producer_id: the writer's stable name: a producer restarted with the same id
                resumes after what it committed, and records sent again are not written
                twice.
            commit_interval_ms: how long a record may wait to be committed (0: only on
                `flush()`).
            max_buffered_records, max_block_s: `send` blocks while this many records
                wait for their commit, at most `max_block_s`, then raises
                `BufferFullError`.

        Opening it fences an older producer of the same id (its next commit raises
        `FencedError`).

        Raises:
            ConfigError: `stream` is not declared.
        """
        return Producer(
            self.lake,
            self.stream(stream),
            producer_id,
            commit_interval_ms,
            max_buffered_records=max_buffered_records,
            max_block_s=max_block_s,
        )

    def consumer(
        self,
        streams: str | list[str],
        group: str,
        *,
        start: str = "beginning",
        auto_commit: bool = True,
        ttl_s: float = DEFAULT_TTL_S,
        auto_offset_reset: str = DEFAULT_AUTO_OFFSET_RESET,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> Consumer:
        """A member of consumer group `group` reading `streams` (deltabus.bus.consumer).

        Args:
            streams: one declared stream or several.
            group: members of one group share the partitions; groups read independently.
            start: where the group starts on a partition it never read: "beginning" (the
                oldest version retention keeps) or "end".
            auto_commit: commit the batches earlier polls returned at each poll.
            ttl_s: a member silent this long loses its partitions to the others.
            auto_offset_reset: Kafka's `auto.offset.reset` for a position that fell
                behind the stream's retention: "latest" (Kafka's default: on from what
                lands next), "earliest" (the oldest version retention keeps) or "error"
                (`poll` raises `OffsetOutOfRangeError`); either move is logged as a
                warning.
            on_assign, on_revoke, on_lost: rebalance callbacks, as Kafka's `subscribe`
                listener (`Consumer` says when each runs).

        Raises:
            ConfigError: a stream is not declared, or `start` or `auto_offset_reset` is
                not one of its options.
        """
        names = [streams] if isinstance(streams, str) else list(streams)
        return Consumer(
            self.lake,
            [self.stream(n) for n in names],
            group,
            start=start,
            auto_commit=auto_commit,
            ttl_s=ttl_s,
            auto_offset_reset=auto_offset_reset,
            on_assign=on_assign,
            on_revoke=on_revoke,
            on_lost=on_lost,
        )

    def transform(
        self, name: str, inputs: str | list[str], output: str, partition: int, fn: TransformFn
    ) -> Transform:
        """Partition `partition` of an exactly-once transform from `inputs` to `output`
        (deltabus.bus.transform); call `.run(stop)` or `.step()`.

        Args:
            name: the transform's stable name: its input positions are committed with its
                output under it.
            inputs: declared streams with `output`'s partition count.
            output: the declared stream written.
            partition: the partition this instance transforms (one per partition, or
                `transform_group` for replicas that share them).
            fn: maps a batch of input rows (with `diff`) to output rows.

        Opening it claims the output partition: an older process of it (or any other
        fenced writer of that partition) stops with `FencedError` at its next commit.

        Raises:
            ConfigError: a stream is not declared, or the partition counts differ.
        """
        names = [inputs] if isinstance(inputs, str) else list(inputs)
        return Transform(
            self.lake, name, [self.stream(n) for n in names], self.stream(output), partition, fn
        )

    def transform_group(
        self,
        name: str,
        inputs: str | list[str],
        output: str,
        fn: TransformFn,
        *,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> TransformGroup:
        """One replica of an exactly-once transform from `inputs` to `output`: run any
        number of them, on any hosts, and they share the partitions by leases in the lake
        (group `transform.<name>`); call `.run(stop)` (deltabus.bus.transform).

        Args:
            name, inputs, output, fn: as `transform`'s.
            ttl_s: a replica silent this long loses its partitions to the others.

        Raises:
            ConfigError: a stream is not declared, the partition counts differ, or
                `transform.<name>` is not a usable group name.
        """
        names = [inputs] if isinstance(inputs, str) else list(inputs)
        return TransformGroup(
            self.lake,
            name,
            [self.stream(n) for n in names],
            self.stream(output),
            fn,
            ttl_s=ttl_s,
        )

    def output_holder(self, table: str) -> dict[str, Any] | None:
        """Who holds fenced output `table` (an ETL, a Pathway link, a transform), or None when no
        writer ever claimed it (or the table does not exist).

        Returns:
            `{"epoch", "owner": {writer, host, pid, mode, started} or None, "alive": True,
            False or None (on another host: unknown), "described": one line}`.
        """
        if not self.lake.exists(table):
            return None
        holder = lease_holder(self.lake.open(table))
        if holder is not None:
            holder["described"] = describe_owner(holder["owner"])
        return holder

    def groups(self) -> list[str]:
        """The consumer groups that have members or positions in the lake, sorted."""
        return list_groups(self.lake)

    def describe_group(self, group: str, streams: list[str] | None = None) -> dict[str, Any]:
        """Consumer group `group` on `streams` (None: every declared stream).

        Returns:
            `{"group": name, "members": [...], "partitions": {table: {"member",
            "position", "lag", "lag_records"}}}`: the live members, and per partition
            table its holder, the next version the group reads, and the versions and
            records landed that it has not committed (None: the group never read the
            table).
        """
        names = streams if streams is not None else self.streams()
        tables = [t for n in names for t in self.stream(n).tables]
        described = Group(self.lake, group).describe(tables)
        for table, state in described["partitions"].items():
            if state is None:
                described["partitions"][table] = {
                    "member": None,
                    "position": None,
                    "lag": None,
                    "lag_records": None,
                }
                continue
            latest = self.lake.latest_version(table)
            state["lag"] = max(0, latest + 1 - state["position"])
            state["lag_records"] = records_between(self.lake, table, state["position"], latest)
        return described

    def delete_group(self, group: str) -> int:
        """Delete consumer group `group` (positions and leases); returns the objects
        removed. Refused while it has live members (deltabus.bus.admin)."""
        return admin.delete_group(self.lake, group)

    def reset_offsets(
        self,
        group: str,
        streams: list[str],
        to: admin.ResetTo,
        value: Any = None,
        *,
        partition: int | None = None,
        dry_run: bool = False,
    ) -> list[admin.Reset]:
        """Set `group`'s positions in `streams` to `earliest`, `latest`, a `datetime`
        (the first version committed at or after `value`) or a `version` (`value`);
        one partition with `partition`. Refused while the group has live members.

        Returns:
            Per partition table, the position before and after (unchanged with `dry_run`).
        """
        found = [self.stream(n) for n in streams]
        return admin.reset_offsets(
            self.lake, group, found, to, value, partition=partition, dry_run=dry_run
        )

    def delete_stream(self, name: str) -> tuple[int, int]:
        """Delete stream `name`: its tables, every group's positions in them, its
        declaration. Returns (objects, bytes) removed. Not undone: producers and
        consumers of it fail at their next call."""
        return admin.delete_stream(self.lake, self.stream(name))


def connect(env_file: str | os.PathLike[str] | None = None, /, **settings: object) -> Bus:
    """Open the lake named by `settings` (fields of deltabus.core.settings.Settings), the
    environment and `.env`, in that order of precedence.

    Raises:
        ConfigError: a setting is invalid, or a named `.env` file cannot be read.

    Example:
        `bus = deltabus.connect(storage="minio", bucket="lake", prefix="prod")`
    """
    return Bus(Lake(load_settings(env_file, **settings)))
