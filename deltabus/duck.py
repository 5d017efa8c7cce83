"""DuckDB over the lake's Delta tables, offline: delta-rs hands DuckDB Arrow datasets.

DuckDB's delta extension cannot be downloaded on offline machines; a pyarrow dataset
from delta-rs is scanned lazily by DuckDB (projection and filter pushdown) instead.
"""

from __future__ import annotations

import duckdb

from deltabus.lake import INPUT_TABLES, REJECTS_TABLE, UNIFIED_TABLE, Lake

ALL_TABLES = (*INPUT_TABLES, UNIFIED_TABLE, REJECTS_TABLE)


def register_delta_views(
    con: duckdb.DuckDBPyConnection, lake: Lake, tables: tuple[str, ...] = ALL_TABLES
) -> list[str]:
    """Expose each existing Delta table as a DuckDB view of the same name; returns them."""
    registered = []
    for table in tables:
        if not lake.exists(table):
            continue
        dataset = lake.open(table).to_pyarrow_dataset()
        con.register(f"{table}__arrow", dataset)
        con.execute(f'CREATE OR REPLACE TEMP VIEW "{table}" AS SELECT * FROM "{table}__arrow"')
        registered.append(table)
    return registered


def lake_connection(lake: Lake, tables: tuple[str, ...] = ALL_TABLES) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the lake's tables as views."""
    con = duckdb.connect()
    register_delta_views(con, lake, tables)
    return con
