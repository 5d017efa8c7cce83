"""Export the unified table as CSV, as the published kafka-alternatives example did."""

from __future__ import annotations

from pathlib import Path

from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.duck import UNIFIED_NET_VIEW, lake_connection
from deltabus.apps.timezones.layout import read_layout
from deltabus.core.errors import StorageError
from deltabus.delta.lake import Lake

RESULT_COLUMNS = ("timestamp", "message", "time", "diff")


def export_results(lake: Lake, out: Path, *, net: bool = False) -> int:
    """Write `timestamp,message,time,diff` ordered by time; returns the row count.

    By default the unified table's changelog, as Pathway's CSV output has it: a row with
    `diff` -1 retracts an earlier row (the input deleted or updated it), so summing
    `diff` per row gives the current content. With `net`, only that net content: each
    row still in the output once, `diff` its multiplicity (1), `time` its last insertion.
    """
    tables = read_layout(lake).unified_tables
    if not any([lake.require_delta_or_absent(t) for t in tables]):
        raise StorageError(f"no unified table at {lake.uri(tables[0])}", "run `deltabus etl` first")
    con = lake_connection(lake, (UNIFIED_TABLE,))
    source = UNIFIED_NET_VIEW if net else UNIFIED_TABLE
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    con.execute(
        f"""COPY (SELECT {", ".join(RESULT_COLUMNS)} FROM "{source}"
                  ORDER BY time, timestamp, message, diff)
            TO '{tmp.as_posix()}' (HEADER, DELIMITER ',')"""
    )
    count = con.execute(f'SELECT count(*) FROM "{source}"').fetchone()[0]  # type: ignore[index]
    tmp.replace(out)  # never leave a half-written CSV behind
    return int(count)
