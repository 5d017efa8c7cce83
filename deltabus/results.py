"""Export the unified table as CSV, as the published kafka-alternatives example did."""

from __future__ import annotations

from pathlib import Path

from deltabus.duck import lake_connection
from deltabus.errors import StorageError
from deltabus.lake import UNIFIED_TABLE, Lake

RESULT_COLUMNS = ("timestamp", "message", "time", "diff")


def export_results(lake: Lake, out: Path) -> int:
    """Write `timestamp,message,time,diff` ordered by time; returns the row count."""
    if not lake.require_delta_or_absent(UNIFIED_TABLE):
        raise StorageError(
            f"no unified table at {lake.uri(UNIFIED_TABLE)}", "run `deltabus etl` first"
        )
    con = lake_connection(lake, (UNIFIED_TABLE,))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    con.execute(
        f"""COPY (SELECT {", ".join(RESULT_COLUMNS)} FROM {UNIFIED_TABLE}
                  ORDER BY time, timestamp, message)
            TO '{tmp.as_posix()}' (HEADER, DELIMITER ',')"""
    )
    count = con.execute(f"SELECT count(*) FROM {UNIFIED_TABLE}").fetchone()[0]  # type: ignore[index]
    tmp.replace(out)  # never leave a half-written CSV behind
    return int(count)
