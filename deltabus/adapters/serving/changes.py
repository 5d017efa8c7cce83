"""What a run of unified rows changes in a served copy of the net content, per message."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

CHANGE_SCHEMA = {
    "message": pl.String,
    "timestamp": pl.Float64,
    "time": pl.Int64,
    "version": pl.Int64,
    "diff": pl.Int64,
}


def message_changes(rows: pa.Table | None) -> pl.DataFrame:
    """The net changes of unified rows (with `_commit_version`, in version order).

    Per (message, timestamp) the diffs are summed: a row inserted and retracted within
    the run changes nothing. What is left is a retraction (diff -1: remove the message's
    row if it holds that timestamp) or an insertion (diff +1: the message's row becomes
    this one; the latest version wins). `version` is the last unified version that
    changed the pair. Columns: CHANGE_SCHEMA.
    """
    if rows is None or rows.num_rows == 0:
        return pl.DataFrame(schema=CHANGE_SCHEMA)
    frame = pl.from_arrow(rows)
    assert isinstance(frame, pl.DataFrame)
    net = (
        frame.group_by("message", "timestamp")
        .agg(
            pl.col("diff").sum().alias("diff"),
            pl.col("time").filter(pl.col("diff") > 0).max().alias("time"),
            pl.col("_commit_version").max().alias("version"),
        )
        .filter(pl.col("diff") != 0)
    )
    return _as_changes(net)


def final_changes(rows: pa.Table | None) -> pl.DataFrame:
    """The state a run of unified rows (with `_commit_version`) leaves each (message,
    timestamp) it touches in, replay-safe for a target without transactions.

    Per (message, timestamp) and commit the diffs are summed; the last commit whose sum
    is not zero decides: an insertion (diff +1, `version` that commit; per message the
    latest wins) or a retraction (diff -1). Unlike `message_changes`, a row inserted and
    retracted within the run is a retraction: a target that applied part of an earlier,
    shorter run (a crash before its position moved) may hold the insertion. Columns:
    CHANGE_SCHEMA.
    """
    if rows is None or rows.num_rows == 0:
        return pl.DataFrame(schema=CHANGE_SCHEMA)
    frame = pl.from_arrow(rows)
    assert isinstance(frame, pl.DataFrame)
    last = (
        frame.group_by("message", "timestamp", "_commit_version")
        .agg(
            pl.col("diff").sum().alias("diff"),
            pl.col("time").filter(pl.col("diff") > 0).max().alias("time"),
        )
        .filter(pl.col("diff") != 0)
        .sort("_commit_version")
        .group_by("message", "timestamp")
        .agg(pl.all().last())
        .rename({"_commit_version": "version"})
    )
    return _as_changes(last)


def _as_changes(decided: pl.DataFrame) -> pl.DataFrame:
    """Rows of (message, timestamp, diff, time, version), one decision each, as
    CHANGE_SCHEMA: retractions, and per message the latest insertion."""
    deletes = decided.filter(pl.col("diff") < 0).with_columns(diff=pl.lit(-1, pl.Int64))
    inserts = (
        decided.filter(pl.col("diff") > 0)
        .sort("version", "time")
        .unique("message", keep="last")
        .with_columns(diff=pl.lit(1, pl.Int64))
    )
    return pl.concat([deletes, inserts]).select(
        pl.col("message").cast(pl.String),
        pl.col("timestamp").cast(pl.Float64),
        pl.col("time").cast(pl.Int64).fill_null(0),
        pl.col("version").cast(pl.Int64),
        pl.col("diff").cast(pl.Int64),
    )
