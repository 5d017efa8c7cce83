"""Input positions kept in an output table: how exactly-once writers resume.

A writer that copies input tables into an output table (a transform, a Pathway sink)
records, in each output commit, the last input version per table that the commit covers,
as app transactions `<app id>@<input table>`, and its own sequence number as app
transaction `<app id>`. App transactions live in the table state and its checkpoints, so
the positions outlive the log files they were written in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Transactions(Protocol):
    def transaction_version(self, app_id: str) -> int | None: ...


def position_marker(app_id: str, table: str) -> str:
    """The app transaction in which writer `app_id` records its position in input `table`."""
    return f"{app_id}@{table}"


def read_positions(
    snapshot: _Transactions, app_id: str, tables: Sequence[str]
) -> tuple[dict[str, int], int]:
    """Per input table, the last version writer `app_id` recorded in `snapshot` (-1: none),
    and the writer's next sequence number (0 when it never committed)."""
    seq = snapshot.transaction_version(app_id)
    positions = {}
    for table in tables:
        version = snapshot.transaction_version(position_marker(app_id, table))
        positions[table] = -1 if version is None else int(version)
    return positions, 0 if seq is None else seq + 1
