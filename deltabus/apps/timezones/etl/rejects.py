"""The rejects table: rows the ETL cannot parse, with source and reason; the stream goes on.

Writes are idempotent per input table: each commit records the highest input version it
covers (app transaction `deltabus-etl-rejects:<table>`), so re-reading inputs after a
restart never rejects a row twice.
"""

from __future__ import annotations

import logging
import threading
import time

import polars as pl

from deltabus.apps.timezones.contracts import REJECTS_SCHEMA, REJECTS_TABLE
from deltabus.core.retry import retry_storage
from deltabus.delta.append import append_once
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table, metadata

log = logging.getLogger(__name__)


class RejectsWriter:
    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self._lock = threading.Lock()
        self._dt = None

    def write(self, source_table: str, bad: pl.DataFrame) -> int:
        """Append rejects from `source_table`; returns how many rows were new."""
        app_id = f"deltabus-etl-rejects:{source_table}"
        with self._lock:
            if self._dt is None:
                self._dt = retry_storage(
                    lambda: ensure_table(self.lake, REJECTS_TABLE, REJECTS_SCHEMA),
                    what="open rejects",
                )
            dt = self._dt
            retry_storage(dt.update_incremental, what="refresh rejects")
            done = dt.transaction_version(app_id)  # rejects of these versions already kept
            if done is not None:
                bad = bad.filter(pl.col("source_version") > done)
            if bad.height == 0:
                return 0
            top = int(bad["source_version"].max())  # type: ignore[arg-type]
            now_ms = int(time.time() * 1000)
            table = (
                bad.with_columns(source_table=pl.lit(source_table), time=pl.lit(now_ms, pl.Int64))
                .select(REJECTS_SCHEMA.names)
                .to_arrow()
                .cast(REJECTS_SCHEMA)
            )
            append_once(
                dt,
                table,
                app_id=app_id,
                seq=top,
                custom_metadata=metadata(**{"etl.rejects_from": source_table}),
                what="commit rejects",
            )
            log.warning(
                "rejected %d row(s) from %s (first reason: %s)",
                table.num_rows,
                source_table,
                bad["reason"][0],
            )
            return table.num_rows
