"""Maintenance of declared streams: each partition table's retention, compaction,
checkpoint, log cleanup and vacuum (deltabus.delta.maintenance), as the stream's settings
ask."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from deltabus.bus.streams import Stream
from deltabus.core.errors import ConfigError
from deltabus.delta.lake import Lake
from deltabus.delta.maintenance import TableMaintenance, maintain_table

log = logging.getLogger(__name__)


@dataclass
class StreamMaintenance:
    """What one pass did to a stream: one `TableMaintenance` per partition table, in
    partition order."""

    stream: str
    retention_s: int | None
    retention_bytes: int | None
    compaction: bool
    tables: list[TableMaintenance] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "retention_s": self.retention_s,
            "retention_bytes": self.retention_bytes,
            "compaction": self.compaction,
            "files_removed": sum(t.retention_files_removed for t in self.tables),
            "bytes_removed": sum(t.retention_bytes_removed for t in self.tables),
            "files_vacuumed": sum(t.files_vacuumed for t in self.tables),
            "tables": [t.as_dict() for t in self.tables],
        }


def maintain_streams(
    lake: Lake, streams: list[Stream], vacuum_retention_hours: float | None = None
) -> list[StreamMaintenance]:
    """Maintain every partition table of `streams`, in order: drop records past the
    stream's retention, compact (when its `compaction` setting is on), checkpoint, clean
    up expired log files, vacuum.

    Args:
        lake: the lake.
        streams: declared streams.
        vacuum_retention_hours: vacuum deletes removed files older than this; None: each
            table's deleted-file retention (`DELTABUS_DELETED_FILE_RETENTION_S` when the
            table was created, else Delta's week). It must exceed any reader's lag.

    Returns:
        What each stream's pass did, in the order of `streams`.
    """
    if vacuum_retention_hours is not None and vacuum_retention_hours < 0:
        raise ConfigError(
            f"the vacuum retention must be >= 0 hours, got {vacuum_retention_hours:g}"
        )
    done = []
    for stream in streams:
        settings = stream.settings
        report = StreamMaintenance(
            stream.name, settings.retention_s, settings.retention_bytes, settings.compaction
        )
        for table in stream.tables:
            if not lake.exists(table):
                continue
            result = maintain_table(
                lake,
                table,
                vacuum_retention_hours,
                settings.compaction,
                retention=settings.retention(),
            )
            log.info("maintained %s: %s", table, result.as_dict())
            report.tables.append(result)
        done.append(report)
    return done
