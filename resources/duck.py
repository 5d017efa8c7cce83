"""DuckDB: `dagster_duckdb.DuckDBResource`, plus the lake's Delta tables as views on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
from dagster_duckdb import DuckDBResource

from deltabus.apps.timezones.duck import ALL_TABLES, register_delta_views
from deltabus.delta.lake import Lake


def duckdb_resource(database: str = ":memory:") -> DuckDBResource:
    """In-memory by default: the data stays in Delta; DuckDB only queries it."""
    return DuckDBResource(database=database)


@contextmanager
def delta_views(
    duck: DuckDBResource, lake: Lake, tables: tuple[str, ...] = ALL_TABLES, load: bool = False
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection where each existing Delta table of `lake` is a view of its name
    (with `load`, a temporary table read once: for many queries over the same data)."""
    with duck.get_connection() as con:
        register_delta_views(con, lake, tables, load=load)
        yield con
