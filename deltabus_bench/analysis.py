"""From raw observations to the report: samples table, percentiles, stages, verdicts.

Every figure is computed by DuckDB over the `latency_samples` Delta table written for
the run (`deltabus.apps.timezones.latency.percentiles`, the SQL the Dagster latency asset
uses), so the report describes exactly the samples stored next to it.
"""

from __future__ import annotations

import logging
import math
from typing import Any
from urllib.parse import unquote

import duckdb
import obstore
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError

from deltabus.apps.timezones.latency import PERCENTILES, over_time, percentile_sql, percentiles

log = logging.getLogger(__name__)

SAMPLES_TABLE = "latency_samples"
SAMPLES_SCHEMA = pa.schema(
    [
        ("message", pa.string()),
        ("sent_ms", pa.float64()),
        ("input_commit_ms", pa.float64()),
        ("etl_processed_ms", pa.float64()),
        ("unified_commit_ms", pa.float64()),
        ("seen_ms", pa.float64()),
        ("latency_ms", pa.float64()),
    ]
)

# Stage segments: (name, from column, to column). Together they add up to latency_ms.
STAGES = (
    ("sent_to_input_commit", "sent_ms", "input_commit_ms"),
    ("input_commit_to_etl", "input_commit_ms", "etl_processed_ms"),
    ("etl_to_unified_commit", "etl_processed_ms", "unified_commit_ms"),
    ("unified_commit_to_seen", "unified_commit_ms", "seen_ms"),
)

# Whether a run kept up is decided in deltabus_bench.verdict, from the over-time series.


# What the producer side contributes to a sample, from either backbone.
INPUTS_SCHEMA = pa.schema(
    [("message", pa.string()), ("sent_ms", pa.float64()), ("input_commit_ms", pa.float64())]
)


def _input_rows(lake, table: str) -> pl.DataFrame:
    """date, message, _change_type, _commit_timestamp of every row of an input table.

    From the change data feed when the whole log is there; when a short log retention
    expired its start, from the live data files, with each file's modification time as
    its commit time (the same moment to within the commit's duration, unless compaction
    rewrote the file).
    """

    dt = lake.open(table)
    columns = ["date", "message", "_change_type", "_commit_timestamp"]
    try:
        reader = dt.load_cdf(starting_version=0, ending_version=dt.version(), columns=columns)
        frame = pl.from_arrow(pa.table(reader.read_all()))
        assert isinstance(frame, pl.DataFrame)
        return frame
    except DeltaError:
        pass  # the change data feed no longer starts at 0 (expired log): the fallback below
    actions = pa.table(dt.get_add_actions(flatten=True)).select(["path", "modification_time"])
    parts = []
    for path, mtime in zip(
        actions["path"].to_pylist(), actions["modification_time"].to_pylist(), strict=True
    ):
        raw = obstore.get(lake.object_store, f"{table}/{unquote(path)}").bytes()
        part = pq.ParquetFile(pa.BufferReader(pa.py_buffer(raw))).read(columns=["date", "message"])
        parts.append(
            pl.from_arrow(part).with_columns(
                _change_type=pl.lit("insert"),
                _commit_timestamp=pl.lit(mtime, pl.Int64).cast(pl.Datetime("ms")),
            )
        )
    return pl.concat(parts) if parts else pl.DataFrame()


def delta_inputs(lake) -> pa.Table:
    """Every message in the input tables' current content: message, sent_ms (its `date`),
    input_commit_ms, from the message's first insertion (a message an input deleted is
    not in its current content)."""
    from deltabus.apps.timezones.layout import read_layout
    from deltabus.apps.timezones.producer import DATE_FORMAT_POLARS

    frames = []
    for table in read_layout(lake).input_tables:  # every partition of both streams
        if not lake.exists(table):
            continue
        frame = _input_rows(lake, table)
        if frame.height == 0:
            continue
        sign = pl.col("_change_type").replace_strict(
            {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1},
            default=0,
            return_dtype=pl.Int64,
        )
        present = (
            frame.group_by("message").agg(sign.sum().alias("copies")).filter(pl.col("copies") > 0)
        )
        first = (
            frame.filter(pl.col("_change_type") == "insert")
            .sort("_commit_timestamp", maintain_order=True)
            .unique(subset="message", keep="first", maintain_order=True)
            .join(present, on="message", how="semi")
        )
        frames.append(
            first.select(
                message=pl.col("message").cast(pl.String),
                sent_ms=pl.col("date")
                .str.strptime(pl.Datetime("us", "UTC"), DATE_FORMAT_POLARS)
                .dt.epoch("us")
                .cast(pl.Float64)
                / 1000,
                input_commit_ms=pl.col("_commit_timestamp")
                .cast(pl.Datetime("ms"))
                .dt.epoch("ms")
                .cast(pl.Float64),
            )
        )
    if not frames:
        return INPUTS_SCHEMA.empty_table()
    return pl.concat(frames).to_arrow()


def build_samples(inputs: pa.Table, seen: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
    """Join what was produced with what the consumer saw (first sighting per message).

    Returns the samples (seen messages only) and bookkeeping: duplicates, rows seen that
    were never produced, retractions, and rows whose parsed timestamp differs from `date`.
    The output is a changelog (`diff` -1 retracts an earlier row): duplicates are counted
    on its net content (sum of `diff` per message above 1), and a sample is a message's
    first insertion.
    """
    con = duckdb.connect()
    con.register("inputs", inputs)
    con.register("seen_raw", seen)
    checks = con.execute(
        """SELECT
             (SELECT count(*) FROM seen_raw WHERE diff <> 1) AS retractions,
             (SELECT coalesce(sum(copies - 1), 0) FROM
                (SELECT sum(diff) AS copies FROM seen_raw GROUP BY message)
                WHERE copies > 1) AS duplicate_rows,
             (SELECT count(*) FROM inputs) AS produced_rows,
             (SELECT count(*) - count(DISTINCT message) FROM inputs) AS duplicate_inputs"""
    ).fetchall()[0]
    con.execute(
        """CREATE TEMP TABLE first_seen AS
           SELECT message, arg_min(timestamp, seen_ms) AS parsed_ms,
                  arg_min(etl_processed_ms, seen_ms) AS etl_processed_ms,
                  arg_min(unified_commit_ms, seen_ms) AS unified_commit_ms,
                  min(seen_ms) AS seen_ms
           FROM seen_raw WHERE diff = 1 GROUP BY message"""
    )
    extra = con.execute(
        """SELECT count(*) FROM first_seen f ANTI JOIN inputs i USING (message)"""
    ).fetchall()[0][0]
    mismatched = con.execute(
        """SELECT count(*) FROM first_seen f JOIN inputs i USING (message)
           WHERE abs(f.parsed_ms - i.sent_ms) > 0.001"""
    ).fetchall()[0][0]
    samples = con.sql(
        # An input commit after the ETL processed the row is a file time from a rewrite
        # (compaction, read through the expired-log fallback): unknown, not negative.
        """SELECT i.message, i.sent_ms,
                  CASE WHEN i.input_commit_ms <= f.etl_processed_ms THEN i.input_commit_ms
                  END AS input_commit_ms,
                  f.etl_processed_ms,
                  f.unified_commit_ms, f.seen_ms, f.seen_ms - i.sent_ms AS latency_ms
           FROM inputs i JOIN first_seen f USING (message)
           ORDER BY i.sent_ms"""
    ).to_arrow_table()
    samples = samples.cast(SAMPLES_SCHEMA)
    return samples, {
        "retractions_seen": int(checks[0]),
        "duplicate_rows_seen": int(checks[1]),
        "produced_rows": int(checks[2]),
        "duplicate_inputs": int(checks[3]),
        "seen_but_not_produced": int(extra),
        "parsed_timestamp_mismatches": int(mismatched),
        "input_commit_unknown": samples.column("input_commit_ms").null_count,
    }


def write_samples(lake, samples: pa.Table) -> str:
    from deltalake import write_deltalake

    from deltabus.core.retry import retry_storage

    uri = lake.uri(SAMPLES_TABLE)
    retry_storage(
        lambda: write_deltalake(
            uri, samples, mode="overwrite", storage_options=lake.storage_options
        ),
        what="write latency_samples",
    )
    return uri


def samples_connection(lake) -> duckdb.DuckDBPyConnection:
    """DuckDB with the stored `latency_samples` Delta table as a view."""
    from deltabus.apps.timezones.duck import register_delta_views

    con = duckdb.connect()
    register_delta_views(con, lake, (SAMPLES_TABLE,))
    return con


def _r(x: Any, nd: int = 4) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), nd)


def analyse(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: float,
    warmup_s: float,
    duration_s: float,
    interval_s: float,
) -> dict[str, Any]:
    """Percentiles, stage breakdown, over-time series and the fell-behind verdict."""
    src = SAMPLES_TABLE
    n_all = con.execute(f"SELECT count(*), min(sent_ms) FROM {src}").fetchall()[0]
    first_sent = n_all[1]
    pct = percentiles(con, src, warmup_s)
    out: dict[str, Any] = {
        "samples": int(pct["samples"]),
        "samples_including_warmup": int(n_all[0]),
        "first_sent_is_schedule_start": first_sent is not None and abs(first_sent - start_ms) < 0.5,
        "percentiles": {k: _r(pct[k]) for k in (*PERCENTILES, "max")},
    }
    where = f"sent_ms >= {start_ms + warmup_s * 1000}"
    stages = {}
    for name, a, b in STAGES:
        seg = con.execute(percentile_sql(src, f"({b} - {a})", where)).fetchall()[0]
        cum = con.execute(percentile_sql(src, f"({b} - sent_ms)", where)).fetchall()[0]
        names = ["samples", *PERCENTILES, "max"]
        seg_d, cum_d = dict(zip(names, seg, strict=True)), dict(zip(names, cum, strict=True))
        stages[name] = {
            "p50": _r(seg_d["p50"]),
            "p99": _r(seg_d["p99"]),
            "p50_since_sent": _r(cum_d["p50"]),
            "p99_since_sent": _r(cum_d["p99"]),
        }
    out["stages"] = stages
    series = over_time(con, src, interval_s)
    out["over_time"] = [{k: _r(v) for k, v in row.items()} for row in series]
    out["stages_over_time"] = stages_over_time(con, src, interval_s)
    return out


def stages_over_time(
    con: duckdb.DuckDBPyConnection, source: str, interval_s: float
) -> list[dict[str, float | None]]:
    """p99 of every stage per `interval_s` of send time: which stage a spike comes from."""
    cols = ",\n".join(f'quantile_cont({b} - {a}, 0.99) / 1000 AS "{name}"' for name, a, b in STAGES)
    cur = con.execute(
        f"""SELECT floor((sent_ms - (SELECT min(sent_ms) FROM {source})) / {interval_s * 1000})
                   * {interval_s} AS t_s,
                   {cols}
            FROM {source} GROUP BY 1 ORDER BY 1"""
    )
    names = [d[0] for d in cur.description]  # type: ignore[union-attr]
    return [{k: _r(v) for k, v in zip(names, row, strict=True)} for row in cur.fetchall()]


def recovery(
    con: duckdb.DuckDBPyConnection,
    *,
    down_ms: float,
    resumed_ms: float,
    warmup_end_ms: float,
    threshold_s: float,
    bucket_s: float = 1.0,
) -> dict[str, Any]:
    """Backlog drain: time from the ETL's resumption until latency stays under threshold.

    Samples are bucketed by the time the consumer saw them; recovery is the start of the
    first bucket after resumption from which every later bucket's p99 (and, separately,
    p50) stays under `threshold_s`.
    """
    rows = con.execute(
        f"""SELECT floor((seen_ms - {resumed_ms}) / {bucket_s * 1000}) AS b,
                   quantile_cont(latency_ms, 0.5) / 1000 AS p50,
                   quantile_cont(latency_ms, 0.99) / 1000 AS p99,
                   max(latency_ms) / 1000 AS mx, count(*) AS n
            FROM {SAMPLES_TABLE} WHERE seen_ms >= {resumed_ms} GROUP BY 1 ORDER BY 1"""
    ).fetchall()
    backlog = con.execute(
        f"""SELECT count(*) FROM {SAMPLES_TABLE}
            WHERE sent_ms >= {down_ms} AND sent_ms < {resumed_ms}"""
    ).fetchall()[0][0]
    peak = con.execute(
        f"SELECT max(latency_ms) / 1000 FROM {SAMPLES_TABLE} WHERE seen_ms >= {down_ms}"
    ).fetchall()[0][0]
    # When was the last message sent before the resumption seen (the backlog drained)?
    drained = con.execute(
        f"SELECT (max(seen_ms) - {resumed_ms}) / 1000 FROM {SAMPLES_TABLE} "
        f"WHERE sent_ms < {resumed_ms}"
    ).fetchall()[0][0]
    baseline = con.execute(
        f"SELECT quantile_cont(latency_ms, 0.99) / 1000 FROM {SAMPLES_TABLE} "
        f"WHERE sent_ms >= {warmup_end_ms} AND seen_ms < {down_ms}"
    ).fetchall()[0][0]

    def settle(col: int, limit: float) -> float | None:
        at = None
        for row in rows:
            if row[col] >= limit:
                at = None
            elif at is None:
                at = row[0] * bucket_s
        return at

    return {
        "down_s": _r((resumed_ms - down_ms) / 1000, 3),
        "backlog_messages": int(backlog),
        "peak_latency_s": _r(peak),
        "backlog_drained_s": _r(drained, 3),
        "threshold_s": threshold_s,
        "recovery_s_p99": _r(settle(2, threshold_s), 3),
        "recovery_s_p50": _r(settle(1, threshold_s), 3),
        "baseline_p99_s": _r(baseline),
        "recovery_s_to_2x_baseline_p99": _r(settle(2, 2 * baseline), 3) if baseline else None,
        "rule": (
            f"first {bucket_s:g}-s bucket (by seen time) after the ETL resumed from which "
            f"every later bucket's p99 (p50) stays under {threshold_s:g} s (and under twice "
            "the p99 before the outage); backlog drained = last message sent before the "
            "resumption seen"
        ),
    }


def quarter_drift(
    con: duckdb.DuckDBPyConnection, start_ms: float, warmup_s: float, duration_s: float
):
    """Soak: p50/p99 per quarter of the post-warm-up span."""
    q = (duration_s - warmup_s) / 4
    t0 = start_ms + warmup_s * 1000
    out = []
    for i in range(4):
        row = con.execute(
            f"""SELECT quantile_cont(latency_ms, 0.5) / 1000, quantile_cont(latency_ms, 0.99) / 1000
                FROM {SAMPLES_TABLE}
                WHERE sent_ms >= {t0 + i * q * 1000} AND sent_ms < {t0 + (i + 1) * q * 1000}"""
        ).fetchall()[0]
        out.append({"quarter": i + 1, "p50": _r(row[0]), "p99": _r(row[1])})
    return out
