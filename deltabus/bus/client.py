"""`deltabus.connect()`: one lake, and the streams, producers and consumers on it."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

from deltabus.bus.consumer import Consumer
from deltabus.bus.groups import DEFAULT_TTL_S, Group, list_groups
from deltabus.bus.producer import DEFAULT_COMMIT_INTERVAL_MS, Producer
from deltabus.bus.streams import (
    Stream,
    StreamSettings,
    create_stream,
    get_stream,
    list_streams,
)
from deltabus.bus.transform import Transform, TransformFn
from deltabus.core.settings import load_settings
from deltabus.delta.lake import Lake


class Bus:
    """A lake seen as a set of streams. Made by `connect()`."""

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
    ) -> Stream:
        """Declare a stream (idempotent; additive schema evolution; settings replace the
        recorded ones when given): see `deltabus.bus.streams.create_stream`."""
        return create_stream(
            self.lake, name, schema, partitions=partitions, key=key, settings=settings
        )

    def stream(self, name: str) -> Stream:
        """A declared stream; ConfigError naming the declared ones when it is not."""
        return get_stream(self.lake, name)

    def streams(self) -> list[str]:
        return list_streams(self.lake)

    def producer(
        self,
        stream: str,
        producer_id: str,
        commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
    ) -> Producer:
        """A producer of `stream`, exactly once per `producer_id` across restarts."""
        return Producer(self.lake, self.stream(stream), producer_id, commit_interval_ms)

    def consumer(
        self,
        streams: str | list[str],
        group: str,
        *,
        start: str = "beginning",
        auto_commit: bool = True,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> Consumer:
        """A member of consumer group `group` reading `streams`."""
        names = [streams] if isinstance(streams, str) else list(streams)
        return Consumer(
            self.lake,
            [self.stream(n) for n in names],
            group,
            start=start,
            auto_commit=auto_commit,
            ttl_s=ttl_s,
        )

    def transform(
        self, name: str, inputs: str | list[str], output: str, partition: int, fn: TransformFn
    ) -> Transform:
        """Partition `partition` of an exactly-once transform from `inputs` to `output`
        (deltabus.bus.transform); call `.run(stop)` or `.step()`."""
        names = [inputs] if isinstance(inputs, str) else list(inputs)
        return Transform(
            self.lake, name, [self.stream(n) for n in names], self.stream(output), partition, fn
        )

    def groups(self) -> list[str]:
        """The consumer groups that have members or positions in the lake, sorted."""
        return list_groups(self.lake)

    def describe_group(self, group: str, streams: list[str] | None = None) -> dict[str, Any]:
        """Live members, and per partition table its holder, position and lag: the
        versions landed that the group has not committed (None: never read)."""
        names = streams if streams is not None else self.streams()
        tables = [t for n in names for t in self.stream(n).tables]
        described = Group(self.lake, group).describe(tables)
        for table, state in described["partitions"].items():
            if state is None:
                described["partitions"][table] = {"member": None, "position": None, "lag": None}
                continue
            latest = self.lake.latest_version(table)
            state["lag"] = max(0, latest + 1 - state["position"])
        return described


def connect(env_file: str | os.PathLike[str] | None = None, /, **settings: object) -> Bus:
    """Open the lake named by `settings` (fields of deltabus.core.settings.Settings), the
    environment and `.env`, in that order of precedence.

    Raises:
        ConfigError: a setting is invalid, or a named `.env` file cannot be read.

    Example:
        `bus = deltabus.connect(storage="minio", bucket="lake", prefix="prod")`
    """
    return Bus(Lake(load_settings(env_file, **settings)))
