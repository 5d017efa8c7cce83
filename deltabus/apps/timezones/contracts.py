"""The time-zone pipeline's contracts (docs/reference/tables.md): its tables, the zone each
input's local times are in, and each table's Arrow schema."""

from __future__ import annotations

import pyarrow as pa

INPUT_TABLES = ("timezone1", "timezone2")
UNIFIED_TABLE = "timezone_unified"
REJECTS_TABLE = "rejects"
TABLE_ZONES = {"timezone1": "America/New_York", "timezone2": "Europe/Paris"}
# Every table the pipeline writes, as maintenance covers them.
PIPELINE_TABLES = (*INPUT_TABLES, UNIFIED_TABLE, REJECTS_TABLE)
# The producer mark (an app transaction of every input partition table, value 1) a
# producer run's last commit records: a bounded ETL ends on it, whatever the log cleanup
# removed since.
FINISHED_MARK = "finished"

INPUT_SCHEMA = pa.schema([("date", pa.string()), ("message", pa.string())])
UNIFIED_SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("message", pa.string()),
        ("time", pa.int64()),
        ("diff", pa.int64()),
    ]
)
REJECTS_SCHEMA = pa.schema(
    [
        ("date", pa.string()),
        ("message", pa.string()),
        ("raw", pa.string()),
        ("source_table", pa.string()),
        ("source_version", pa.int64()),
        ("reason", pa.string()),
        ("time", pa.int64()),
    ]
)
