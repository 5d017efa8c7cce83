"""Lake maintenance: compact small files, checkpoint the log, clean up expired log files,
vacuum old files.

Safe during streaming: compaction commits carry no new data (readers of the change
data feed get no rows from them), and vacuum only removes files older than the
retention, which must stay longer than the slowest reader's lag.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from deltalake import DeltaTable

from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.compaction import CompactionConflict, compact
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)


@dataclass
class TableMaintenance:
    table: str
    version_before: int
    version_after: int
    files_compacted: int
    files_added: int
    checkpoint_version: int
    files_vacuumed: int

    def as_dict(self) -> dict:
        return asdict(self)


def maintain_table(
    lake: Lake,
    table: str,
    retention_hours: float,
    compaction: bool = True,
    full_vacuum: bool | None = None,
) -> TableMaintenance:
    """Compact (unless `compaction` is off), checkpoint, clean up expired log files and
    vacuum `table`. `full_vacuum`: remove every file no version within the retention
    references, not only those the tombstones name (default: when the retention is an
    hour or more)."""
    full = retention_hours >= 1 if full_vacuum is None else full_vacuum
    dt = lake.open(table)
    before = dt.version()
    compacted, added = _compact(lake, table, dt) if compaction else (0, 0)
    retry_storage(dt.update_incremental, what=f"load {table}")
    retry_storage(dt.create_checkpoint, what=f"checkpoint {table}")
    checkpoint = dt.version()
    # Log files older than the table's delta.logRetentionDuration and behind the
    # checkpoint; live writers and tails reload from the checkpoint when they need to.
    retry_storage(dt.cleanup_metadata, what=f"clean up the log of {table}")
    # Full (a retention of an hour or more): every file no version within the retention
    # references, not only those the log's tombstones still name. With the deleted-file
    # retention at the vacuum's (a soak's), a tombstone leaves the checkpoints just as its
    # file becomes old enough, and a vacuum by tombstones never removes a compacted file
    # (docs/adr/0035). Under an hour, tombstones only: a full vacuum could take the data
    # file of a commit in flight.
    vacuumed = retry_storage(
        lambda: dt.vacuum(
            retention_hours=int(retention_hours),
            dry_run=False,
            enforce_retention_duration=False,
            full=full,
        ),
        what=f"vacuum {table}",
    )
    return TableMaintenance(
        table=table,
        version_before=before,
        version_after=dt.version(),
        files_compacted=compacted,
        files_added=added,
        checkpoint_version=checkpoint,
        files_vacuumed=len(vacuumed),
    )


def _compact(lake: Lake, table: str, dt: DeltaTable) -> tuple[int, int]:
    """Files removed and added by compacting `table`: beside live writers where this
    package can rewrite the table (deltabus.delta.compaction), else by delta-rs. A conflict
    with another writer's delete or schema change leaves the files to the next pass."""
    try:
        done = compact(lake, table, dt=dt)
    except CompactionConflict as exc:
        log.info("compaction of %s left to the next pass: %s", table, exc)
        return 0, 0
    if done is not None:
        return done.files_removed, done.files_added
    metrics = retry_storage(lambda: dt.optimize.compact(), what=f"compact {table}")
    return int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))


def maintain(
    lake: Lake,
    tables: tuple[str, ...],
    retention_hours: float = 24.0,
    uncompacted: frozenset[str] = frozenset(),
) -> list[TableMaintenance]:
    """Maintain every existing table of `tables`; `retention_hours` must exceed any reader's lag.
    Tables in `uncompacted` are checkpointed and vacuumed but not compacted."""
    if retention_hours < 0:
        raise ConfigError(f"retention must be >= 0 hours, got {retention_hours}")
    done = []
    for table in tables:
        if not lake.exists(table):
            continue
        result = maintain_table(lake, table, retention_hours, table not in uncompacted)
        log.info("maintained %s: %s", table, result.as_dict())
        done.append(result)
    return done
