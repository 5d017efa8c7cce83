"""Lake maintenance: drop records past a table's retention, compact small files,
checkpoint the log, clean up expired log files, vacuum old files.

Safe during streaming: retention and compaction commits carry no new data (their
actions have `dataChange: false`: readers of the change data feed get no rows from
them), and vacuum only removes files older than the retention, which must stay longer
than the slowest reader's lag.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import pyarrow as pa
from deltalake import DeltaTable

from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.checkpoint_writer import create_checkpoint_once
from deltabus.delta.compaction import CompactionConflict, compact
from deltabus.delta.lake import Lake
from deltabus.delta.retention import (
    RETENTION_APP_ID,
    RetentionConflict,
    RetentionPolicy,
    apply_retention,
)
from deltabus.delta.vacuum import vacuum

log = logging.getLogger(__name__)


# Compaction keeps a table under a retention by time in segments of a tenth of it.
SEGMENTS_PER_RETENTION = 10
# Delta's default `delta.deletedFileRetentionDuration`.
DEFAULT_DELETED_FILE_RETENTION_HOURS = 7 * 24.0
_INTERVAL = re.compile(r"\s*interval\s+(\d+)\s+([a-z]+?)s?\s*", re.IGNORECASE)
_UNIT_HOURS = {
    "millisecond": 1 / 3_600_000,
    "second": 1 / 3600,
    "minute": 1 / 60,
    "hour": 1.0,
    "day": 24.0,
    "week": 168.0,
}


@dataclass
class TableMaintenance:
    """What one maintenance pass did to a table.

    `retention_*`: the files and bytes the retention commit (`retention_version`, None:
    none) dropped, and the oldest version retention keeps (0: every version);
    `live_files` / `live_bytes`: the table's live data files afterwards."""

    table: str
    version_before: int
    version_after: int
    files_compacted: int
    files_added: int
    checkpoint_version: int
    files_vacuumed: int
    retention_files_removed: int = 0
    retention_bytes_removed: int = 0
    retention_version: int | None = None
    oldest_version_kept: int = 0
    live_files: int = 0
    live_bytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def deleted_file_retention_hours(dt: DeltaTable) -> float:
    """The table's `delta.deletedFileRetentionDuration` in hours (Delta's week when unset
    or unreadable)."""
    value = dt.metadata().configuration.get("delta.deletedFileRetentionDuration")
    match = _INTERVAL.fullmatch(value or "")
    if match is None or match.group(2).lower() not in _UNIT_HOURS:
        return DEFAULT_DELETED_FILE_RETENTION_HOURS
    return int(match.group(1)) * _UNIT_HOURS[match.group(2).lower()]


def maintain_table(
    lake: Lake,
    table: str,
    retention_hours: float | None,
    compaction: bool = True,
    full_vacuum: bool | None = None,
    retention: RetentionPolicy | None = None,
) -> TableMaintenance:
    """Apply `retention` (deltabus.delta.retention), compact (unless `compaction` is
    off), checkpoint, clean up expired log files and vacuum `table`.

    `retention_hours`: vacuum deletes removed files older than this (None: the table's
    deleted-file retention, `delta.deletedFileRetentionDuration`, a week by default).
    `full_vacuum`: remove every file no version within the retention references, not
    only those the tombstones name (default: when the retention is an hour or more)."""
    dt = lake.open(table)
    vacuum_hours = deleted_file_retention_hours(dt) if retention_hours is None else retention_hours
    full = vacuum_hours >= 1 if full_vacuum is None else full_vacuum
    before = dt.version()
    retained = None
    if retention is not None and retention.limited:
        try:
            retained = apply_retention(lake, table, retention, dt=dt)
        except RetentionConflict as exc:
            log.info("retention of %s left to the next pass: %s", table, exc)
        retry_storage(dt.update_incremental, what=f"load {table}")
    segment_ms = segment_for(retention)
    compacted, added = _compact(lake, table, dt, segment_ms) if compaction else (0, 0)
    retry_storage(dt.update_incremental, what=f"load {table}")
    retry_storage(lambda: create_checkpoint_once(lake, table, dt), what=f"checkpoint {table}")
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
    vacuumed = vacuum(lake, table, dt, retention_hours, full)
    live = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    return TableMaintenance(
        table=table,
        version_before=before,
        version_after=dt.version(),
        files_compacted=compacted,
        files_added=added,
        checkpoint_version=checkpoint,
        files_vacuumed=vacuumed,
        retention_files_removed=retained.files_removed if retained else 0,
        retention_bytes_removed=retained.bytes_removed if retained else 0,
        retention_version=retained.version if retained else None,
        oldest_version_kept=(
            retained.oldest_version if retained else dt.transaction_version(RETENTION_APP_ID) or 0
        ),
        live_files=len(live),
        live_bytes=sum(live),
    )


def segment_for(retention: RetentionPolicy | None) -> int | None:
    """Compaction's time segment in ms under `retention`: a tenth of a retention by time
    (at least a second), so records outlive it by at most about a tenth; None without one."""
    if retention is None or retention.max_age_s is None:
        return None
    return max(1, retention.max_age_s // SEGMENTS_PER_RETENTION) * 1000


def _compact(
    lake: Lake, table: str, dt: DeltaTable, segment_ms: int | None = None
) -> tuple[int, int]:
    """Files removed and added by compacting `table`: beside live writers where this
    package can rewrite the table (deltabus.delta.compaction), else by delta-rs. A conflict
    with another writer's delete or schema change leaves the files to the next pass."""
    try:
        done = compact(lake, table, dt=dt, segment_ms=segment_ms)
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
    retention_hours: float | None = 24.0,
    uncompacted: frozenset[str] = frozenset(),
    retention: Mapping[str, RetentionPolicy] | None = None,
) -> list[TableMaintenance]:
    """Maintain every existing table of `tables`; `retention_hours` (vacuum's; None: each
    table's deleted-file retention) must exceed any reader's lag. Tables in `uncompacted`
    are checkpointed and vacuumed but not compacted; `retention` gives the tables whose
    old records are dropped, and how (deltabus.delta.retention)."""
    if retention_hours is not None and retention_hours < 0:
        raise ConfigError(f"retention must be >= 0 hours, got {retention_hours}")
    done = []
    for table in tables:
        if not lake.exists(table):
            continue
        result = maintain_table(
            lake,
            table,
            retention_hours,
            table not in uncompacted,
            retention=(retention or {}).get(table),
        )
        log.info("maintained %s: %s", table, result.as_dict())
        done.append(result)
    return done
