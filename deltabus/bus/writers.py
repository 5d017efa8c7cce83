"""A stream's partition tables opened for appends, as producers, transforms and
connectors write them."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from deltabus.bus.fence import Lease, claim
from deltabus.bus.streams import Stream, written_types
from deltabus.core.retry import retry_storage
from deltabus.delta.append import TableAppender
from deltabus.delta.checkpoints import BackgroundCheckpointer
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table


@dataclass
class PartitionWriter:
    """One partition table of a stream: its appender, the checkpointer its commits hand
    checkpoints to, the Arrow types rows are cast to before they are appended, and the
    writer's claim on the table (None: opened unfenced)."""

    table: str
    appender: TableAppender
    checkpointer: BackgroundCheckpointer
    types: pa.Schema
    lease: Lease | None = None


def open_writer(
    lake: Lake, stream: Stream, partition: int, *, claim_as: str | None = None
) -> PartitionWriter:
    """Open partition `partition` of `stream` for appends (creating its table with the
    stream's settings if it is missing); retries storage failures.

    With `claim_as` (how fencing messages name the writer, e.g. "transform eur") the table
    is first claimed with the next fence epoch (deltabus.bus.fence), so an older writer
    of it stops at its next commit, and the appender starts from the claimed snapshot.

    Raises:
        StorageError: the lake failed past the retry budget.
    """
    table = stream.table(partition)
    dt = retry_storage(
        lambda: ensure_table(lake, table, stream.schema, stream.settings.properties()),
        what=f"open {table}",
    )
    types = written_types(dt, stream.schema)
    lease = claim(dt, table, types, "continuous", claim_as) if claim_as else None
    return PartitionWriter(
        table=table,
        appender=TableAppender(lake, table, dt),
        checkpointer=BackgroundCheckpointer(lake, table, stream.settings.checkpoint_interval),
        types=types,
        lease=lease,
    )


def open_writers(lake: Lake, stream: Stream) -> list[PartitionWriter]:
    """Every partition of `stream` opened for appends, in partition order."""
    return [open_writer(lake, stream, p) for p in range(stream.partitions)]


def close_writers(writers: list[PartitionWriter]) -> None:
    """Stop the writers' checkpointers (each finishes the checkpoint it is writing)."""
    for writer in writers:
        writer.checkpointer.close()
