"""Every exception a user of deltabus may catch, in one place.

    from deltabus.errors import DeltabusError

    try:
        producer.flush()
    except DeltabusError as exc:
        if not exc.retriable:
            raise
        ...  # the same call can succeed later

Each class carries `retriable: bool`: True when the same call can succeed if tried again
unchanged (storage or a serving store came back, a conflicting commit was read), False
when something must change first (settings, a record, an input table, a newer writer
stopping). Tell errors apart by type and by `retriable`, never by their text.

`DeltabusError` is the base of the errors a user can fix: `problem` says what is wrong,
`hint` how to fix it. The conflicts between concurrent writers of one table
(`VersionTakenError`, `CompactionConflict`, `RetentionConflict`) are plain exceptions
that deltabus resolves itself (it reads or plans again); only a caller of the low-level
table helpers meets them.

This module belongs to the core layer: it imports nothing else of deltabus.
"""

from deltabus.core.errors import (
    BufferFullError,
    ChangeWithoutCdfError,
    CompactionConflict,
    ConfigError,
    DeltabusError,
    FencedError,
    InputTableError,
    MissingExtraError,
    OffsetOutOfRangeError,
    OpenSearchRed,
    OpenSearchUnreachable,
    PostgresUnreachable,
    RecordError,
    RemovedFileError,
    RetentionConflict,
    StoppedDuringOutage,
    StorageError,
    UnreadableFileError,
    UnsupportedFeatureError,
    VersionTakenError,
)

__all__ = [
    "BufferFullError",
    "ChangeWithoutCdfError",
    "CompactionConflict",
    "ConfigError",
    "DeltabusError",
    "FencedError",
    "InputTableError",
    "MissingExtraError",
    "OffsetOutOfRangeError",
    "OpenSearchRed",
    "OpenSearchUnreachable",
    "PostgresUnreachable",
    "RecordError",
    "RemovedFileError",
    "RetentionConflict",
    "StoppedDuringOutage",
    "StorageError",
    "UnreadableFileError",
    "UnsupportedFeatureError",
    "VersionTakenError",
]
