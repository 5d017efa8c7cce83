"""End-to-end latency, defined once (docs/design/architecture.md), computed by DuckDB.

A latency sample is one message: `sent_ms` (its scheduled send time, the `date`
value), and the moments it passed each stage, in epoch milliseconds. The same SQL
serves the benchmark (samples from a tailing consumer) and the Dagster latency asset
(samples derived from the unified table's commit log).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.layout import read_layout
from deltabus.delta.lake import Lake

PERCENTILES: dict[str, float] = {
    "p50": 0.50,
    "p75": 0.75,
    "p85": 0.85,
    "p95": 0.95,
    "p99": 0.99,
    "p99.9": 0.999,
}


def percentile_sql(source: str, value: str = "latency_ms", where: str = "TRUE") -> str:
    """SELECT count, p50 .. p99.9 and max of `value` (seconds) over `source`."""
    cols = ",\n  ".join(
        f'quantile_cont({value}, {q}) / 1000.0 AS "{name}"' for name, q in PERCENTILES.items()
    )
    return f"""SELECT count(*) AS samples,
  {cols},
  max({value}) / 1000.0 AS "max"
FROM {source}
WHERE {where}"""


def after_warmup(source: str, warmup_s: float) -> str:
    """A WHERE clause keeping samples sent after the first `warmup_s` seconds of the run."""
    return f"sent_ms >= (SELECT min(sent_ms) FROM {source}) + {float(warmup_s) * 1000.0}"


def percentiles(
    con: duckdb.DuckDBPyConnection, source: str, warmup_s: float = 0.0, value: str = "latency_ms"
) -> dict[str, Any]:
    """Latency percentiles in seconds after the warm-up, plus the sample count."""
    sql = percentile_sql(source, value, after_warmup(source, warmup_s))
    row = con.execute(sql).fetchone()
    names = [d[0] for d in con.description]  # type: ignore[union-attr]
    return dict(zip(names, row, strict=True))  # type: ignore[arg-type]


def distinct_events(
    con: duckdb.DuckDBPyConnection, source: str, warmup_s: float, column: str
) -> int:
    """How many distinct `column` values (messages, ETL batches, commits) are behind a
    stage after the warm-up: one means the stage has one value, not a distribution."""
    row = con.execute(
        f"SELECT count(DISTINCT {column}) FROM {source} WHERE {after_warmup(source, warmup_s)}"
    ).fetchone()
    return int(row[0]) if row else 0


def over_time(
    con: duckdb.DuckDBPyConnection, source: str, interval_s: float = 1.0, value: str = "latency_ms"
) -> list[dict[str, float]]:
    """p50/p95/p99 (seconds) per `interval_s` of send time, for latency-over-time plots."""
    rows = con.execute(
        f"""SELECT floor((sent_ms - (SELECT min(sent_ms) FROM {source})) / {interval_s * 1000})
                   * {interval_s} AS t_s,
                   quantile_cont({value}, 0.5) / 1000 AS p50,
                   quantile_cont({value}, 0.95) / 1000 AS p95,
                   quantile_cont({value}, 0.99) / 1000 AS p99,
                   count(*) AS samples
            FROM {source} GROUP BY 1 ORDER BY 1"""
    ).fetchall()
    return [dict(zip(("t_s", "p50", "p95", "p99", "samples"), r, strict=True)) for r in rows]


def unified_samples(lake: Lake) -> pa.Table:
    """Samples from the unified table alone: sent -> processed (Pathway time) -> committed.

    One sample per message, from its first insertion (`diff` +1): a message an input
    later updated or deleted is retracted and maybe inserted again, but it was first
    seen then. `latency_ms` is commit-visible minus sent: the earliest moment any
    consumer could see the row, so it is a lower bound of the consumer-observed
    end-to-end latency.
    """
    changes = []
    for name in read_layout(lake).unified_tables:  # every partition of the output
        if name != UNIFIED_TABLE and not lake.exists(name):
            continue
        dt = lake.open(name)
        changes.append(pa.table(dt.load_cdf(starting_version=0, ending_version=dt.version())))
    table = pa.concat_tables(changes, promote_options="default")
    con = duckdb.connect()
    con.register("cdf", table)
    return con.sql(
        """WITH inserted AS (
             SELECT message, timestamp AS sent_ms, time::DOUBLE AS processed_ms,
                    epoch_ms(_commit_timestamp::TIMESTAMP)::DOUBLE AS committed_ms
             FROM cdf WHERE _change_type = 'insert' AND diff > 0)
           SELECT message,
                  arg_min(sent_ms, (committed_ms, processed_ms)) AS sent_ms,
                  arg_min(processed_ms, (committed_ms, processed_ms)) AS processed_ms,
                  min(committed_ms) AS committed_ms,
                  min(committed_ms) - arg_min(sent_ms, (committed_ms, processed_ms))
                    AS latency_ms
           FROM inserted GROUP BY message"""
    ).to_arrow_table()
