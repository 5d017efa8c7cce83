"""Fencing: at most one writer (an ETL, a Pathway link) writes an output table, as Kafka
fences zombie producers.

Every such writer, on start, claims its output table by committing a new epoch: an empty
commit whose app transaction `deltabus-etl-epoch` is one more than the table's current
one, with the claimant (writer, host, pid, mode, start time) in its commit metadata. It
then reads its input positions from the snapshot that includes its own claim.

Why that is enough: the writer commits with delta-rs' own retries off, so a commit lands
only as the version right after the snapshot it was built on. An older writer's commit
therefore either lands before the claim (and the new writer's positions include it) or
conflicts with it; on every conflict, and whenever the sink swaps in a fresher table
handle, the writer re-checks the epoch and stops with `FencedError` when it is no longer
the newest. The Delta log orders claims and commits, so no message can be written twice
or skipped, whatever the timing. A crashed writer holds nothing: the next one simply
claims the next epoch, so a restart is never blocked.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltabus.core import metrics
from deltabus.core.errors import FencedError as FencedError
from deltabus.core.retry import retry_storage
from deltabus.delta.tables import find_commit, is_commit_conflict, meta, metadata

log = logging.getLogger(__name__)

EPOCH_APP_ID = "deltabus-etl-epoch"
OWNER_SEARCH_LIMIT = 500  # commits searched for the claim that names an epoch's owner


def current_epoch(dt: DeltaTable) -> int:
    """The newest claimed epoch in `dt`'s snapshot (0 when no ETL ever claimed it)."""
    return dt.transaction_version(EPOCH_APP_ID) or 0


def epoch_owner(dt: DeltaTable, epoch: int) -> dict[str, Any] | None:
    """Who holds `epoch` (host, pid, mode, started).

    Found in the newest commit of that epoch: its claim, or any commit of its sink, which
    carry the owner too; None when neither is among the last `OWNER_SEARCH_LIMIT` commits.
    """
    info = find_commit(dt, lambda c: meta(c, "etl.epoch") == epoch, limit=OWNER_SEARCH_LIMIT)
    return meta(info, "etl.owner") if info else None


def describe_owner(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "owner unknown"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(owner.get("started", 0)))
    return (
        f"{owner.get('mode', '?')} {owner.get('writer', 'ETL')}, pid {owner.get('pid', '?')} "
        f"on {owner.get('host', '?')}, started {started} UTC"
    )


@dataclass(frozen=True)
class Lease:
    """A writer's claim on its output table."""

    table: str
    epoch: int
    claimed_version: int
    owner: dict[str, Any]

    def check(self, dt: DeltaTable) -> None:
        """Raise `FencedError` when `dt`'s snapshot shows a newer claim than ours."""
        newest = current_epoch(dt)
        if newest == self.epoch:
            return
        owner = epoch_owner(dt, newest)
        writer = self.owner.get("writer", "ETL")
        metrics.FENCED.labels(metrics.component()).inc()
        raise FencedError(
            f"another {writer} took over {self.table} (epoch {newest}: "
            f"{describe_owner(owner)}); this {writer} (epoch {self.epoch}) stopped without "
            f"writing its last batch, which the newer {writer} reads again",
            f"run one {writer} per output table: stop the other one, or leave it running "
            "and let this one go",
        )


def claim(dt: DeltaTable, table: str, schema: pa.Schema, mode: str, writer: str = "ETL") -> Lease:
    """Claim `dt` (of contract `schema`) with the next epoch for `writer` (how messages
    name it, e.g. "ETL"); fences every older writer of the table."""
    owner = {
        "writer": writer,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "mode": mode,
        "started": round(time.time(), 3),
    }

    def attempt() -> Lease:
        dt.update_incremental()
        previous = current_epoch(dt)
        epoch = previous + 1
        write_deltalake(
            dt,
            schema.empty_table(),
            mode="append",
            commit_properties=CommitProperties(
                custom_metadata=metadata(**{"etl.epoch": epoch, "etl.owner": owner}),
                app_transactions=[Transaction(EPOCH_APP_ID, epoch)],
                max_commit_retries=0,
            ),
        )
        if previous:
            log.info(
                "claimed %s as %s epoch %d; a writer still running as epoch %d (%s) stops "
                "at its next commit",
                table,
                writer,
                epoch,
                previous,
                describe_owner(epoch_owner(dt, previous)),
            )
        else:
            log.info("claimed %s as %s epoch %d", table, writer, epoch)
        return Lease(table=table, epoch=epoch, claimed_version=dt.version(), owner=owner)

    return retry_storage(attempt, what=f"claim {table}", also_retry=is_commit_conflict)


def lease_holder(dt: DeltaTable) -> dict[str, Any] | None:
    """The current epoch of `dt`, its owner, and whether that process is alive.

    `alive` is None when the owner runs on another host (this one cannot tell).
    """
    epoch = current_epoch(dt)
    if not epoch:
        return None
    owner = epoch_owner(dt, epoch)
    alive: bool | None = None
    if owner and owner.get("host") == socket.gethostname():
        from deltabus.core.processes import process_alive

        alive = process_alive(int(owner.get("pid", -1)), "deltabus")
    return {"epoch": epoch, "owner": owner, "alive": alive}
