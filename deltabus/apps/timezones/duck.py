"""DuckDB over the lake's Delta tables, offline: delta-rs hands DuckDB Arrow data.

DuckDB's delta extension cannot be downloaded on offline machines; a pyarrow dataset
from delta-rs is scanned lazily by DuckDB (projection and filter pushdown) instead. A
table whose protocol the pyarrow dataset cannot honour (column mapping, deletion
vectors: inputs written by other Delta writers) is read through delta-rs' own scan,
which applies both, into memory.

`timezone_unified` is a changelog: a row with `diff` -1 retracts an earlier row (an input
deleted or updated it). Next to its view, `timezone_unified_net` holds its net content:
each (timestamp, message) whose diffs sum to something other than 0, with that sum as
`diff` (1 for a row that is in the output once) and the last insertion `time`.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from deltabus.apps.timezones.contracts import INPUT_TABLES, REJECTS_TABLE, UNIFIED_TABLE
from deltabus.apps.timezones.layout import read_layout
from deltabus.delta.lake import Lake

ALL_TABLES = (*INPUT_TABLES, UNIFIED_TABLE, REJECTS_TABLE)
STREAMS = (*INPUT_TABLES, UNIFIED_TABLE)  # partitioned when the lake's layout says so
UNIFIED_NET_VIEW = f"{UNIFIED_TABLE}_net"
NET_SQL = f"""SELECT timestamp, message,
       max(time) FILTER (WHERE diff > 0) AS time,
       sum(diff)::BIGINT AS diff
FROM "{UNIFIED_TABLE}"
GROUP BY timestamp, message
HAVING sum(diff) <> 0"""


def needs_delta_scan(dt: DeltaTable) -> bool:
    """True when the table's reader features are beyond a plain pyarrow dataset."""
    features = set(dt.protocol().reader_features or ())
    return dt.protocol().min_reader_version == 2 or bool(
        features & {"columnMapping", "deletionVectors"}
    )


def arrow_source(dt: DeltaTable) -> pa.Table | object:
    """What DuckDB should scan for `dt`: a lazy dataset, or the scanned table."""
    if needs_delta_scan(dt):
        return pa.table(dt.scan())
    return dt.to_pyarrow_dataset()


def register_delta_views(
    con: duckdb.DuckDBPyConnection,
    lake: Lake,
    tables: tuple[str, ...] = ALL_TABLES,
    load: bool = False,
) -> list[str]:
    """Expose each existing Delta table as a DuckDB view of the same name; returns them.

    With `load`, each is a temporary table instead, read from the lake once: a view scans
    every data file again on each query, which over many small files on an object store
    costs more than the queries. With `timezone_unified` comes the `timezone_unified_net`
    view of its net content.
    """
    layout = read_layout(lake)
    registered = []
    for table in tables:
        # A partitioned stream is one view over all of its partition tables.
        parts = layout.inputs(table) if table in STREAMS else [table]
        parts = [p for p in parts if lake.exists(p)]
        if not parts:
            continue
        for part in parts:
            con.register(f"{part}__arrow", arrow_source(lake.open(part)))
        union = " UNION ALL BY NAME ".join(f'SELECT * FROM "{p}__arrow"' for p in parts)
        kind = "TABLE" if load else "VIEW"
        con.execute(f'CREATE OR REPLACE TEMP {kind} "{table}" AS {union}')
        if load:
            for part in parts:
                con.unregister(f"{part}__arrow")
        registered.append(table)
        if table == UNIFIED_TABLE:
            con.execute(f'CREATE OR REPLACE TEMP VIEW "{UNIFIED_NET_VIEW}" AS {NET_SQL}')
    return registered


def lake_connection(lake: Lake, tables: tuple[str, ...] = ALL_TABLES) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the lake's tables as views.

    Args:
        lake: the lake whose tables to expose.
        tables: the table names; each that exists becomes a view of that name (a
            missing one is left out), and `timezone_unified` brings its net-content view
            `timezone_unified_net`.

    Returns:
        A DuckDB connection; the caller closes it.

    Example:
        `lake_connection(lake).sql("SELECT count(*) FROM timezone_unified").fetchone()`
    """
    con = duckdb.connect()
    register_delta_views(con, lake, tables)
    return con
