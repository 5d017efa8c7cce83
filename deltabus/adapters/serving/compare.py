"""Does the served table equal the unified table's net content? Read both and compare.

The unified side is DuckDB over the Delta table (`timezone_unified_net`, apps.timezones.duck);
the served side is read with COPY ... TO STDOUT (DuckDB's postgres extension cannot be
downloaded offline), each message given back from its stored form (a message holding a
NUL character is stored escaped, deltabus.adapters.serving.postgres_target), so every
message is compared.
"""

from __future__ import annotations

import io
from typing import Any

import polars as pl

from deltabus.adapters.serving import pg
from deltabus.adapters.serving.postgres_target import POSITION_TABLE, check_table_name, message_text
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.duck import UNIFIED_NET_VIEW, lake_connection
from deltabus.delta.lake import Lake

EXAMPLES = 10


def unified_net(lake: Lake) -> pl.DataFrame:
    """message, timestamp, copies of every row in the unified table's net content."""
    con = lake_connection(lake, (UNIFIED_TABLE,))
    try:
        if not lake.exists(UNIFIED_TABLE):
            return pl.DataFrame(
                schema={"message": pl.String, "timestamp": pl.Float64, "copies": pl.Int64}
            )
        return con.sql(
            f'SELECT message, "timestamp", diff AS copies FROM "{UNIFIED_NET_VIEW}" WHERE diff > 0'
        ).pl()
    finally:
        con.close()


def unified_net_count(lake: Lake) -> int:
    """Rows in the unified table's net content (messages, counted once each)."""
    return unified_net(lake)["message"].n_unique()


def served(dsn: str, table: str) -> pl.DataFrame:
    """message, timestamp, time, version of every row of the served table; `message` is
    the message itself, whatever form it is stored in."""
    con = pg.connect(dsn)
    try:
        buffer = io.BytesIO()
        with con.cursor() as cur:
            cur.copy_expert(
                f'COPY (SELECT message, message_escaped, "timestamp", "time", version FROM '
                f"{check_table_name(table)}) TO STDOUT WITH (FORMAT csv)",
                buffer,
            )
        con.rollback()
    finally:
        con.close()
    rows = pl.read_csv(
        io.BytesIO(buffer.getvalue()),
        has_header=False,
        new_columns=["message", "message_escaped", "timestamp", "time", "version"],
        schema_overrides={
            "message": pl.String,
            "message_escaped": pl.String,
            "timestamp": pl.Float64,
            "time": pl.Int64,
            "version": pl.Int64,
        },
    )
    escaped = rows["message_escaped"] == "t"
    if escaped.any():
        plain = rows.filter(~escaped)
        held = rows.filter(escaped)
        texts = [message_text(m, True) for m in held["message"]]
        rows = pl.concat([plain, held.with_columns(message=pl.Series(texts, dtype=pl.String))])
    return rows.drop("message_escaped")


def served_position(dsn: str, sink: str) -> dict[str, Any] | None:
    """The sink's row of deltabus_sink_position (version, source, commit ms), or None."""
    con = pg.connect(dsn)
    try:
        with con.cursor() as cur:
            cur.execute(
                f"SELECT version, source_table, source_commit_ms, updated_at FROM {POSITION_TABLE} "
                "WHERE sink = %s",
                (sink,),
            )
            row = cur.fetchone()
        con.rollback()
    finally:
        con.close()
    if row is None:
        return None
    return dict(
        zip(("version", "source_table", "source_commit_ms", "updated_at"), row, strict=True)
    )


def difference(net: pl.DataFrame, rows: pl.DataFrame) -> dict[str, Any]:
    """Counts and examples of what differs between served `rows` (message, timestamp)
    and the unified net content `net` (`unified_net`)."""
    expected = net.unique("message")
    missing = expected.join(rows, on="message", how="anti")
    extra = rows.join(expected, on="message", how="anti")
    changed = rows.join(expected, on="message").filter(
        pl.col("timestamp") != pl.col("timestamp_right")
    )
    return {
        "served_rows": rows.height,
        "unified_net_rows": expected.height,
        "duplicated_in_unified": int(net.filter(pl.col("copies") > 1).height),
        "missing": missing.height,
        "extra": extra.height,
        "timestamp_mismatches": changed.height,
        "missing_examples": missing["message"].head(EXAMPLES).to_list(),
        "extra_examples": extra["message"].head(EXAMPLES).to_list(),
    }


def compare(lake: Lake, dsn: str, table: str) -> dict[str, Any]:
    """Counts and examples of what differs between the served table and the net content."""
    return difference(unified_net(lake), served(dsn, table))


def unified_lag(lake: Lake, position: int) -> dict[str, Any]:
    """How far a sink at `position` is behind timezone_unified: versions, and seconds
    since the oldest unified commit it does not hold yet (0 when it holds them all;
    None when that commit's log file has expired)."""
    import time

    from deltabus.bus.tail import DeltaLogTail
    from deltabus.delta.snapshots import parse_actions

    latest = lake.open(UNIFIED_TABLE).version()
    lag_s: float | None = 0.0
    if position < latest:
        raw = DeltaLogTail(lake, UNIFIED_TABLE).log.commit(position + 1)
        info = (parse_actions(raw).get("commitInfo") or [{}])[0] if raw else {}
        committed_ms = info.get("inCommitTimestamp", info.get("timestamp"))
        lag_s = None
        if committed_ms is not None:
            lag_s = round(max(0.0, time.time() - int(committed_ms) / 1000), 3)
    return {
        "position": position,
        "unified_version": latest,
        "versions_behind": max(0, latest - position),
        "lag_s": lag_s,
    }


def serving_lag(lake: Lake, dsn: str, sink: str) -> dict[str, Any]:
    """How far the served table is behind timezone_unified (`unified_lag`), with the
    sink's position row."""
    import json

    row = served_position(dsn, sink)
    lag = unified_lag(lake, -1 if row is None else int(row["version"]))
    return lag | {"position_row": json.dumps(row, default=str) if row else None}
