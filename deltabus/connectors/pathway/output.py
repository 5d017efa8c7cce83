"""The output table of a deltabus Pathway sink, opened for exactly-once writing.

Opening creates the table if it is missing, claims it (fencing every older writer of it,
deltabus.bus.fence), then reads the input positions and the sink's sequence from the
snapshot that holds the claim: whatever an older writer committed before the claim is
included, and it can commit nothing after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable

from deltabus.bus.fence import Lease, claim
from deltabus.bus.positions import read_positions
from deltabus.bus.streams import written_types
from deltabus.core.retry import retry_storage
from deltabus.delta.append import TableAppender
from deltabus.delta.checkpoints import BackgroundCheckpointer
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table

# Reads (positions per input table, next sequence number) from the claimed snapshot.
PositionReader = Callable[[DeltaTable], tuple[dict[str, int], int]]


@dataclass
class Output:
    """An output table opened by `open_output`: what a `TableSink` writes through.

    `positions`: per input table, the last version already in the output (-1: none);
    `next_seq`: the sink's next sequence number; `types`: the Arrow types rows are cast
    to before they are appended; `lease`: None when opened unfenced."""

    table: str
    app_id: str
    appender: TableAppender
    checkpointer: BackgroundCheckpointer
    lease: Lease | None
    positions: dict[str, int]
    next_seq: int
    types: pa.Schema

    @property
    def snapshot(self) -> DeltaTable:
        """The table as the appender last saw it (the claim included)."""
        return self.appender.dt

    def close(self) -> None:
        """Stop the checkpointer (it finishes the checkpoint it is writing)."""
        self.checkpointer.close()


def open_output(
    lake: Lake,
    table: str,
    schema: pa.Schema,
    *,
    app_id: str,
    inputs: Sequence[str],
    writer: str,
    mode: str = "continuous",
    fence: bool = True,
    properties: dict[str, str] | None = None,
    checkpoint_interval: int | None = None,
    positions: PositionReader | None = None,
) -> Output:
    """Open `table` for sink `app_id` copying `inputs`; retries storage failures.

    Args:
        lake: the lake holding the table.
        table: the output table, created with `schema` and `properties` if missing.
        schema: the output's columns.
        app_id: the sink's stable name: its sequence and position markers
            (deltabus.bus.positions).
        inputs: the input tables whose positions the sink records.
        writer: names the writer in fencing messages ("ETL", "Pathway link eur").
        mode: recorded with the claim ("continuous", "bounded").
        fence: claim the table, so that an older writer still running stops at its next
            commit; False leaves other writers be (and the output unfenced).
        properties: table properties of a new table, over deltabus' own.
        checkpoint_interval: checkpoint every this many versions (None: the lake's).
        positions: reads the positions from the claimed snapshot, for writers with an
            older record of them (default: `read_positions` for `app_id`).

    Raises:
        StorageError: `table` holds files but is not a Delta table, or the lake failed
            past the retry budget.
    """
    lake.require_delta_or_absent(table)
    dt = retry_storage(lambda: ensure_table(lake, table, schema, properties), what=f"open {table}")
    lease = claim(dt, table, schema, mode, writer) if fence else None
    read = positions or (lambda snapshot: read_positions(snapshot, app_id, inputs))
    found, seq = retry_storage(lambda: read(dt), what=f"read the positions of {table}")
    return Output(
        table=table,
        app_id=app_id,
        appender=TableAppender(lake, table, dt),
        checkpointer=BackgroundCheckpointer(lake, table, checkpoint_interval),
        lease=lease,
        positions=found,
        next_seq=seq,
        types=written_types(dt, schema),
    )
