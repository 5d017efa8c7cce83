"""The time-zone lake's layout: each input stream and the unified output as P partition
tables (deltabus.bus.partitions): `timezone1-p0` … `timezone1-p{P-1}`. The producer's
message ids are numbered, and a lake's partitioner (recorded with P) maps the number to a
partition, the same on every machine and every restart:

- `sticky` (new lakes): a commit window's messages go to one partition, the next window's
  to the next, round robin; a window of more than MAX_CHUNK messages is cut into equal
  chunks that go on round robin. Like Kafka's sticky partitioner, it keeps the number of
  commits what one partition would make until the rate fills a window, since every table
  commit costs CPU whatever its size (docs/adr/0011-sticky-partitioner.md).
- `hash` (lakes recorded before `sticky`): a 64-bit mix of the run and the message number.

The unified output is partitioned the same way:
`timezone_unified-p{i}` is written from partition i of both inputs, by exactly one ETL
(its fence and its input positions are that table's own), so ETL processes split the
work by partition with no coordination, like consumers of a consumer group.

P = 1 is the original layout: `timezone1`, `timezone2`, `timezone_unified`. A lake
records its P in `_deltabus/layout.json` (written once, with a conditional PUT, when a
producer first writes P > 1), so readers never have to be told it; a producer asking for
another P than the lake has is refused: partitions are not added or removed in place.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import obstore
from obstore.exceptions import AlreadyExistsError, PreconditionError

import deltabus
from deltabus import MAX_PARTITIONS, partition_table
from deltabus.apps.timezones.contracts import INPUT_SCHEMA, INPUT_TABLES, UNIFIED_TABLE
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

LAYOUT_KEY = "_deltabus/layout.json"
PARTITIONERS = ("sticky", "hash")
# The most messages a partition takes from one commit window before the next partition
# takes the rest (Kafka's batch.size, in messages): bounds the burst one ETL process gets.
MAX_CHUNK = 65_536


@dataclass(frozen=True)
class TimezoneLayout:
    """How many partitions the lake's streams have, and the tables that follow from it."""

    partitions: int = 1
    partitioner: str = "sticky"

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(f"partitions must be 1..{MAX_PARTITIONS}, got {self.partitions}")
        if self.partitioner not in PARTITIONERS:
            raise ConfigError(
                f"unknown partitioner {self.partitioner!r}: one of {', '.join(PARTITIONERS)}"
            )

    def inputs(self, stream: str) -> list[str]:
        return [partition_table(stream, i, self.partitions) for i in range(self.partitions)]

    @property
    def input_tables(self) -> list[str]:
        """Every input partition table, stream by stream."""
        return [t for stream in INPUT_TABLES for t in self.inputs(stream)]

    @property
    def unified_tables(self) -> list[str]:
        return self.inputs(UNIFIED_TABLE)

    def inputs_of(self, partition: int) -> list[str]:
        """Partition `partition` of each input stream: what feeds that unified partition."""
        return [partition_table(s, partition, self.partitions) for s in INPUT_TABLES]

    def unified_of(self, partition: int) -> str:
        return partition_table(UNIFIED_TABLE, partition, self.partitions)

    def stream_of(self, table: str) -> str:
        """`timezone1-p3` -> `timezone1`."""
        stream, _, part = table.rpartition("-p")
        return stream if self.partitions > 1 and part.isdigit() else table

    def owned(self, process: int, processes: int) -> list[int]:
        """The partitions ETL process `process` of `processes` owns: i mod N == process,
        a fixed assignment every process computes alike."""
        if not 1 <= processes <= self.partitions:
            raise ConfigError(
                f"ETL processes must be 1..{self.partitions} (one partition at least each), "
                f"got {processes}"
            )
        if not 0 <= process < processes:
            raise ConfigError(f"ETL process index must be 0..{processes - 1}, got {process}")
        return [i for i in range(self.partitions) if i % processes == process]


SINGLE = TimezoneLayout(1)  # the original layout: one table per stream


def partition_of(run_id: str, index: np.ndarray, layout: TimezoneLayout, window: int) -> np.ndarray:
    """Partition of messages `<run_id>-<index>` (module docstring): a function of the run,
    the message number and the run's commit window (messages per commit), nothing else, so
    a resumed run puts every message where it went before."""
    if layout.partitions == 1:
        return np.zeros(len(index), dtype=np.int64)
    if layout.partitioner == "hash":
        return _hash_partition(run_id, index, layout.partitions)
    if window < 1:
        raise ValueError(f"a commit window has at least one message, got {window}")
    k = -(-window // MAX_CHUNK)  # chunks per window
    chunk = (index // window) * k + (index % window) * k // window
    offset = _fnv1a(run_id.encode()) % layout.partitions  # runs start on different partitions
    return ((chunk + offset) % layout.partitions).astype(np.int64)


def _hash_partition(run_id: str, index: np.ndarray, partitions: int) -> np.ndarray:
    """The `hash` partitioner: a 64-bit mix of the run id's FNV-1a and the number."""
    run_key = np.uint64(_fnv1a(run_id.encode()))
    with np.errstate(over="ignore"):
        z = index.astype(np.uint64) ^ run_key
        z = (z ^ (z >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
        z = (z ^ (z >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
        z = z ^ (z >> np.uint64(33))
    return (z % np.uint64(partitions)).astype(np.int64)


def _fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def declare_inputs(lake: Lake, layout: TimezoneLayout) -> None:
    """Declare the input streams with the layout's partition count (idempotent), so that
    consumer groups, `deltabus streams` and Dagster's `declared_streams` see them.

    Raises:
        ConfigError: a stream of an input's name is declared otherwise.
    """
    bus = deltabus.Bus(lake)
    for stream in INPUT_TABLES:
        bus.create_stream(stream, INPUT_SCHEMA, partitions=layout.partitions)


def read_layout(lake: Lake) -> TimezoneLayout:
    """The lake's layout: its record, else one partition (the original layout)."""
    raw = retry_storage(lambda: _get(lake), what="read the lake layout")
    return TimezoneLayout(1) if raw is None else _parse(lake, raw)


def ensure_layout(
    lake: Lake, partitions: int | None, partitioner: str = "sticky"
) -> TimezoneLayout:
    """The layout a producer writes with: the lake's own when `partitions` is None;
    recorded with `partitioner` when the lake is new and P > 1; refused when the lake
    has another P. A lake that exists keeps the partitioner it recorded."""
    raw = retry_storage(lambda: _get(lake), what="read the lake layout")
    if raw is not None:
        current = _parse(lake, raw)
        if partitions is not None and current.partitions != partitions:
            raise _refused(lake, current.partitions, partitions)
        return current
    wanted = TimezoneLayout(partitions or 1, partitioner)
    if wanted.partitions == 1:
        return wanted
    if any(lake.exists(t) for t in (*INPUT_TABLES, UNIFIED_TABLE)):
        raise _refused(lake, 1, wanted.partitions)  # the original layout, unrecorded
    body = json.dumps(
        {
            "partitions": wanted.partitions,
            "partitioner": wanted.partitioner,
            "streams": list(INPUT_TABLES),
        }
    )
    try:
        retry_storage(
            lambda: obstore.put(lake.object_store, LAYOUT_KEY, body.encode(), mode="create"),
            what="record the lake layout",
        )
        log.info(
            "recorded %d partitions per stream at %s/%s", wanted.partitions, lake.root, LAYOUT_KEY
        )
    except (AlreadyExistsError, PreconditionError):
        pass  # another producer recorded it first: what it recorded is the layout
    current = read_layout(lake)
    if current.partitions != wanted.partitions:
        raise _refused(lake, current.partitions, wanted.partitions)
    return current


def _parse(lake: Lake, raw: bytes) -> TimezoneLayout:
    try:
        record = json.loads(raw)
        # Lakes recorded before the sticky partitioner have no field: they hash.
        return TimezoneLayout(int(record["partitions"]), record.get("partitioner", "hash"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{lake.root}/{LAYOUT_KEY} is not a deltabus layout record ({exc})",
            "restore it, or point DELTABUS_PREFIX at another lake",
        ) from None


def _refused(lake: Lake, have: int, want: int) -> ConfigError:
    return ConfigError(
        f"the lake at {lake.root} has {have} partition{'s' if have != 1 else ''} per "
        f"stream, not {want}; partitions are not added or removed in place",
        f"leave out --partitions (or give {have}), or use a new prefix (DELTABUS_PREFIX / "
        "--prefix) for a lake with another partition count",
    )


def _get(lake: Lake) -> bytes | None:
    try:
        return bytes(obstore.get(lake.object_store, LAYOUT_KEY).bytes())
    except FileNotFoundError:
        return None
