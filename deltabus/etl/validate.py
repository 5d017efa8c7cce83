"""Split an input batch into rows the ETL can parse and rejects with a reason.

Runs vectorised (Polars) in the source, so bad rows never enter the dataflow and the
pipeline goes on; nothing is dropped silently: every reject keeps its raw row.
"""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa

EXPECTED = ("date", "message")
# Change-data-feed bookkeeping columns that are not part of the table.
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp", "_diff")
# What Pathway's strptime("%Y-%m-%d %H:%M:%S.%f %z") accepts, in Polars' dialect: rows
# that pass here never make the Pathway expression fail.
PARSE_FORMAT = "%Y-%m-%d %H:%M:%S%.f %z"


def split_valid(batch: pa.Table) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(valid rows with `date`, `message`, `_commit_version`, `_diff`; rejects with `reason`).

    `_diff` is +1 for a row the input gained and -1 for one it lost (a delete, or the
    pre-image of an update); the source sets it, and batches without it are appends.
    """
    frame = pl.from_arrow(batch)
    assert isinstance(frame, pl.DataFrame)
    if "_diff" not in frame.columns:
        frame = frame.with_columns(_diff=pl.lit(1, pl.Int64))
    extra = [c for c in frame.columns if c not in EXPECTED and c not in CDF_COLUMNS]
    reasons: list[pl.Expr] = []
    for col in EXPECTED:
        if col not in frame.columns:
            frame = frame.with_columns(pl.lit(None, pl.String).alias(col))
            reasons.append(pl.lit(f"missing column {col}"))
        elif frame.schema[col] not in (pl.String, pl.Categorical):
            dtype = frame.schema[col]
            frame = frame.with_columns(pl.col(col).cast(pl.String, strict=False))
            reasons.append(pl.lit(f"{col} has type {dtype}, expected string"))
    reason = pl.coalesce(
        *reasons,
        pl.when(pl.col("date").is_null()).then(pl.lit("null date")),
        pl.when(pl.col("message").is_null()).then(pl.lit("null message")),
        pl.when(
            pl.col("date")
            .str.strptime(pl.Datetime("us", "UTC"), PARSE_FORMAT, strict=False)
            .is_null()
        ).then(pl.lit("malformed date: expected %Y-%m-%d %H:%M:%S.%f %z")),
        *(pl.when(pl.col(c).is_not_null()).then(pl.lit(f"unexpected column {c}")) for c in extra),
        pl.lit(None, pl.String),
    )
    frame = frame.with_columns(_reason=reason)
    valid = frame.filter(pl.col("_reason").is_null()).select(
        "date", "message", "_commit_version", pl.col("_diff").cast(pl.Int64)
    )
    bad = frame.filter(pl.col("_reason").is_not_null())
    if bad.height:
        raw_cols = [c for c in bad.columns if c not in CDF_COLUMNS and c != "_reason"]
        raw = [json.dumps(r, default=str) for r in bad.select(raw_cols).iter_rows(named=True)]
        bad = bad.select(
            pl.col("date"),
            pl.col("message"),
            pl.Series("raw", raw, pl.String),
            pl.col("_commit_version").cast(pl.Int64).alias("source_version"),
            pl.col("_reason").alias("reason"),
        )
    else:
        bad = pl.DataFrame(
            schema={
                "date": pl.String,
                "message": pl.String,
                "raw": pl.String,
                "source_version": pl.Int64,
                "reason": pl.String,
            }
        )
    return valid, bad
