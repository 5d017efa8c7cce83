"""Administration of consumer groups and streams, as Kafka's `kafka-consumer-groups` and
`kafka-topics` do it: delete a group, reset its positions, delete a stream.

A group's positions may change only while it has no live member (Kafka refuses a reset
of a group that is not empty, for the same reason: a member would overwrite the new
position with its own at its next commit).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import obstore

from deltabus.bus.groups import GROUPS_PREFIX, Group, check_group
from deltabus.bus.streams import STREAMS_PREFIX, Stream
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.retention import oldest_version
from deltabus.delta.vacuum import delete_paced

log = logging.getLogger(__name__)

ResetTo = Literal["earliest", "latest", "datetime", "version"]


@dataclass(frozen=True)
class Reset:
    """One partition's position before and after a reset (None: the group never read it)."""

    table: str
    before: int | None
    after: int


def _keys(lake: Lake, prefix: str) -> list[tuple[str, int]]:
    """(key, size) of every object under `prefix/` (one LIST per 1,000)."""

    def listed() -> list[tuple[str, int]]:
        return [
            (str(meta["path"]), int(meta["size"]))
            for chunk in obstore.list(lake.object_store, prefix=f"{prefix}/", chunk_size=1000)
            for meta in chunk
        ]

    return retry_storage(listed, what=f"list {prefix}")


def _refuse_live(group: Group, action: str) -> None:
    members = group.live_members()
    if members:
        raise ConfigError(
            f"group {group.name} has {len(members)} live member(s) ({', '.join(members)}): "
            f"cannot {action} while it is in use",
            "stop its consumers first (a member that leaves stops at once; one that died "
            f"is gone after the lease time, {group.ttl_ms / 1000:g} s)",
        )


def delete_group(lake: Lake, name: str) -> int:
    """Delete consumer group `name`: its positions and leases. Returns the objects removed.

    Raises:
        ConfigError: the group has live members, or no such group is in the lake.
    """
    group = Group(lake, check_group(name))
    _refuse_live(group, "delete it")
    keys = [k for k, _ in _keys(lake, group.prefix)]
    if not keys:
        raise ConfigError(f"no consumer group {name!r} in the lake at {lake.root}")
    delete_paced(lake, keys, 0, f"delete group {name}")
    return len(keys)


def position_at(lake: Lake, table: str, to: ResetTo, value: Any = None) -> int:
    """The version a group reads next in `table` for a reset `to`.

    `earliest`: the oldest version the stream's retention keeps (0 when it dropped
    nothing), Kafka's log start offset; `latest`: after the newest version (only what
    lands from now on);
    `datetime` (`value` an aware datetime): the first version committed at or after it,
    Kafka's `offsets_for_times`, or after the newest when none is; `version` (`value` an
    int): that version.
    """
    if to == "earliest":
        return oldest_version(lake, table)
    newest = retry_storage(lambda: lake.latest_version(table), what=f"list {table}'s log")
    if to == "latest":
        return newest + 1
    if to == "version":
        version = int(value)
        if not 0 <= version <= newest + 1:
            raise ConfigError(
                f"{table} has versions 0..{newest}: version {version} is not one of them",
                f"give a version from 0 to {newest + 1} ({newest + 1}: only what lands next)",
            )
        return version
    if to == "datetime":
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ConfigError("--to-datetime needs a time zone", "e.g. 2026-11-28T06:00:00Z")
        wanted_ms = value.timestamp() * 1000
        history = retry_storage(lambda: lake.open(table).history(), what=f"history of {table}")
        after = [int(h["version"]) for h in history if float(h["timestamp"]) >= wanted_ms]
        return min(after) if after else newest + 1
    raise ConfigError(f"reset to {to!r}: choose earliest, latest, datetime or version")


def reset_offsets(
    lake: Lake,
    name: str,
    streams: list[Stream],
    to: ResetTo,
    value: Any = None,
    *,
    partition: int | None = None,
    dry_run: bool = False,
) -> list[Reset]:
    """Set group `name`'s positions in `streams` (one partition with `partition`).

    Returns:
        Each partition's position before and after (written unless `dry_run`).

    Raises:
        ConfigError: the group has live members (nothing is written), the partition is
            out of range, or the target is invalid.
    """
    group = Group(lake, check_group(name))
    _refuse_live(group, "reset its positions")
    tables: list[str] = []
    for stream in streams:
        if partition is not None and not 0 <= partition < stream.partitions:
            raise ConfigError(
                f"stream {stream.name} has partitions 0..{stream.partitions - 1}, not {partition}"
            )
        tables += [stream.table(partition)] if partition is not None else stream.tables
    plan = []
    for table in tables:
        current = group.lease(table)
        plan.append((table, current, position_at(lake, table, to, value)))
    if not dry_run:
        for table, current, after in plan:
            if group.write(current, table, None, after) is None:
                raise ConfigError(
                    f"group {name}: a member wrote {table}'s position during the reset",
                    "stop the group's consumers, then reset again",
                )
    return [Reset(t, None if c is None else c.position, a) for t, c, a in plan]


def stream_objects(lake: Lake, stream: Stream) -> list[tuple[str, int]]:
    """(key, size) of everything a stream keeps: its declaration, its partition tables and
    every group's position in them."""
    found = _keys(lake, f"{STREAMS_PREFIX}/{stream.name}")
    for table in stream.tables:
        found += _keys(lake, table)
    tables = set(stream.tables)
    for key, size in _keys(lake, GROUPS_PREFIX):
        parts = key.split("/")
        if len(parts) >= 6 and parts[3] == "partitions" and parts[4] in tables:
            found.append((key, size))
    return found


def delete_stream(lake: Lake, stream: Stream) -> tuple[int, int]:
    """Delete `stream`: its partition tables, the groups' positions in them, and last its
    declaration. Returns (objects, bytes) removed."""
    found = stream_objects(lake, stream)
    declaration = [k for k, _ in found if k.startswith(f"{STREAMS_PREFIX}/")]
    rest = [k for k, _ in found if not k.startswith(f"{STREAMS_PREFIX}/")]
    delete_paced(lake, rest, 0, f"delete stream {stream.name}'s tables")
    delete_paced(lake, declaration, 0, f"delete stream {stream.name}'s declaration")
    log.info("deleted stream %s: %d objects", stream.name, len(found))
    return len(found), sum(size for _, size in found)
