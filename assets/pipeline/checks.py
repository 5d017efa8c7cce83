"""Asset checks on timezone_unified: DuckDB SQL over the Delta tables, and a GX 1.x suite.

timezone_unified is a changelog: a row with diff -1 retracts an earlier one (an input
deleted or updated it). Checks about content (nothing lost, nothing duplicated,
timestamps in their window) look at its net content, the `timezone_unified_net` view:
a message is in the output as many times as its diffs sum to. Each failing check names
what failed in its description and shows examples (rows or figures) in its metadata.
"""

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    MetadataValue,
    multi_asset_check,
)
from dagster_duckdb import DuckDBResource

from assets.common import markdown_table
from deltabus.apps.timezones.contracts import (
    INPUT_TABLES,
    REJECTS_TABLE,
    UNIFIED_SCHEMA,
    UNIFIED_TABLE,
)
from deltabus.apps.timezones.duck import UNIFIED_NET_VIEW
from deltabus.delta.lake import Lake
from deltabus.delta.tables import meta
from resources.duck import delta_views
from resources.lake import LakeResource

EXAMPLES = 10
CONTRACT_SQL_TYPES = {
    "timestamp": "DOUBLE",
    "message": "VARCHAR",
    "time": "BIGINT",
    "diff": "BIGINT",
}
RUN_OF_MESSAGE = r"regexp_extract(u.message, '^(.*)-[0-9]+$', 1)"  # message = '<run>-<n>'
# Net copies of each message in the output: the sum of its diffs (1 when present once).
NET_COPIES_SQL = f"""SELECT message, sum(diff)::BIGINT AS copies
FROM "{UNIFIED_TABLE}" GROUP BY message"""


def _rows(con: Any, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _scalar(con: Any, sql: str) -> Any:
    return con.execute(sql).fetchall()[0][0]


def _examples(rows: list[dict[str, Any]]) -> MetadataValue:
    return MetadataValue.md(markdown_table(rows))


def _missing_unified(lake: Lake, registered: list[str]) -> AssetCheckResult | None:
    if UNIFIED_TABLE in registered:
        return None
    return AssetCheckResult(
        passed=False,
        description=f"no Delta table at {lake.uri(UNIFIED_TABLE)}: materialize timezone_unified",
    )


def _inputs_sql(registered: list[str]) -> str:
    parts = [
        f"SELECT message, '{t}' AS source FROM \"{t}\"" for t in INPUT_TABLES if t in registered
    ]
    return (
        " UNION ALL ".join(parts)
        if parts
        else "SELECT NULL::VARCHAR AS message, '' AS source WHERE FALSE"
    )


def no_message_lost(lk: Lake, con: Any, registered: list[str]) -> AssetCheckResult:
    if (missing := _missing_unified(lk, registered)) is not None:
        return missing
    con.execute(f"CREATE OR REPLACE TEMP VIEW inputs AS {_inputs_sql(registered)}")
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW present AS "
        f"SELECT message FROM ({NET_COPIES_SQL}) WHERE copies > 0"
    )
    input_rows = _scalar(con, "SELECT count(*) FROM inputs")
    distinct = _scalar(con, "SELECT count(*) FROM present")
    lost = _scalar(con, "SELECT count(*) FROM inputs i ANTI JOIN present u USING (message)")
    lost_examples = _rows(
        con,
        "SELECT i.message, i.source FROM inputs i ANTI JOIN present u "
        f"USING (message) ORDER BY i.message LIMIT {EXAMPLES}",
    )
    unexpected = _scalar(con, "SELECT count(*) FROM present u ANTI JOIN inputs i USING (message)")
    passed = lost == 0 and distinct == input_rows
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else f"{lost} of {input_rows} input messages are missing from timezone_unified's net "
        f"content ({distinct} messages there, {unexpected} of them not in the inputs)",
        metadata={
            "input_rows": int(input_rows),
            "unified_distinct_messages": int(distinct),
            "lost_messages": int(lost),
            "unexpected_messages": int(unexpected),
            "lost_examples": _examples(lost_examples),
        },
    )


def no_duplicate_message(lk: Lake, con: Any, registered: list[str]) -> AssetCheckResult:
    if (missing := _missing_unified(lk, registered)) is not None:
        return missing
    con.execute(
        f"""CREATE OR REPLACE TEMP VIEW dupes AS
            SELECT * FROM ({NET_COPIES_SQL}) WHERE copies > 1 OR copies < 0"""
    )
    dupes = _scalar(con, "SELECT count(*) FROM dupes WHERE copies > 1")
    extra_rows = _scalar(con, "SELECT coalesce(sum(copies - 1), 0) FROM dupes WHERE copies > 1")
    negative = _scalar(con, "SELECT count(*) FROM dupes WHERE copies < 0")
    retractions = _scalar(con, f'SELECT count(*) FROM "{UNIFIED_TABLE}" WHERE diff < 0')
    examples = _rows(
        con, f"SELECT * FROM dupes ORDER BY abs(copies) DESC, message LIMIT {EXAMPLES}"
    )
    passed = dupes == 0 and negative == 0
    problems = []
    if dupes:
        problems.append(f"{dupes} messages are duplicated ({extra_rows} extra rows)")
    if negative:
        problems.append(f"{negative} messages are retracted more often than inserted")
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else "in timezone_unified's net content, " + " and ".join(problems),
        metadata={
            "duplicated_messages": int(dupes),
            "extra_rows": int(extra_rows),
            "over_retracted_messages": int(negative),
            "retraction_rows": int(retractions),
            "examples": _examples(examples),
        },
    )


_gx_import: threading.Thread | None = None
_gx_lock = threading.Lock()


def _import_great_expectations() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations  # noqa: F401
    import great_expectations.expectations  # noqa: F401


def preload_great_expectations() -> None:
    """Start importing Great Expectations on a thread, once per process.

    Importing it costs about 7 s of one core (its validation of a 10k-row table takes
    0.1 s). A step that would otherwise sit waiting (the stream window, while the ETL
    process starts) calls this, so the check that uses it later finds it loaded.
    """
    global _gx_import
    with _gx_lock:
        if _gx_import is None:
            _gx_import = threading.Thread(
                target=_import_great_expectations, name="import-gx", daemon=True
            )
            _gx_import.start()


def run_gx_not_null_suite(frame: Any, columns: list[str]) -> list[dict[str, Any]]:
    """Great Expectations 1.x, ephemeral context, pandas datasource: not-null per column.

    Returns one result per column: column, success, unexpected_count, unexpected_index_list.
    """
    preload_great_expectations()
    assert _gx_import is not None
    _gx_import.join()
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch_def = (
        context.data_sources.add_pandas("deltabus")
        .add_dataframe_asset(UNIFIED_TABLE)
        .add_batch_definition_whole_dataframe("whole_table")
    )
    suite = context.suites.add(gx.ExpectationSuite(name="timezone_unified_not_null"))
    for column in columns:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=column))
    batch = batch_def.get_batch(batch_parameters={"dataframe": frame})
    validation = batch.validate(suite, result_format="SUMMARY")
    out = []
    for res in validation.results:
        result = res.result or {}
        out.append(
            {
                "column": res.expectation_config.kwargs.get("column"),
                "success": bool(res.success),
                "unexpected_count": int(result.get("unexpected_count") or 0),
                "unexpected_index_list": list(result.get("partial_unexpected_index_list") or []),
                "error": (res.exception_info or {}).get("exception_message")
                if not res.success
                else None,
            }
        )
    return out


def no_nulls(lk: Lake, con: Any, registered: list[str]) -> AssetCheckResult:
    if (missing := _missing_unified(lk, registered)) is not None:
        return missing
    frame = con.execute(f'SELECT * FROM "{UNIFIED_TABLE}"').df()
    columns = list(UNIFIED_SCHEMA.names)
    results = run_gx_not_null_suite(frame, columns)
    failed = [r for r in results if not r["success"]]
    example_idx = sorted({i for r in failed for i in r["unexpected_index_list"]})[:EXAMPLES]
    examples = [
        {c: (None if _isnull(frame.iloc[i][c]) else frame.iloc[i][c]) for c in frame.columns}
        for i in example_idx
        if i < len(frame)
    ]
    passed = not failed
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else "nulls in "
        + ", ".join(f"{r['column']} ({r['unexpected_count']} rows)" for r in failed),
        metadata={
            "rows": len(frame),
            **{f"nulls_{r['column']}": r["unexpected_count"] for r in results},
            "examples": _examples(examples),
            "validator": "great_expectations (ephemeral context, pandas dataframe)",
        },
    )


def _isnull(value: Any) -> bool:
    try:
        return value is None or value != value  # NaN
    except (TypeError, ValueError):
        return False


def producer_windows(lake: Lake) -> pa.Table:
    """Per producer run (from its commit metadata): scheduled first and last send time, ms."""
    windows: dict[str, tuple[float, float]] = {}
    for table in INPUT_TABLES:
        if not lake.exists(table):
            continue
        for info in lake.open(table).history():
            run = meta(info, "producer.run_id")
            if run is None or run in windows:
                continue
            start_ms = int(meta(info, "producer.start_us")) / 1000
            rate = float(meta(info, "producer.rate"))
            total = int(meta(info, "producer.total"))
            windows[str(run)] = (start_ms, start_ms + max(total - 1, 0) * 1000 / rate)
    return pa.table(
        {
            "producer_run": pa.array(list(windows), pa.string()),
            "start_ms": pa.array([w[0] for w in windows.values()], pa.float64()),
            "end_ms": pa.array([w[1] for w in windows.values()], pa.float64()),
        }
    )


def timestamp_in_producer_window(lk: Lake, con: Any, registered: list[str]) -> AssetCheckResult:
    if (missing := _missing_unified(lk, registered)) is not None:
        return missing
    windows = producer_windows(lk)
    con.register("producer_windows", windows)
    con.execute(
        f"""CREATE OR REPLACE TEMP VIEW outside AS
            SELECT u.message, u.timestamp,
                   epoch_ms(TRY_CAST(u.timestamp AS BIGINT))::VARCHAR AS timestamp_utc,
                   w.producer_run IS NOT NULL AS run_known,
                   epoch_ms(w.start_ms::BIGINT)::VARCHAR AS window_start_utc,
                   epoch_ms(w.end_ms::BIGINT)::VARCHAR AS window_end_utc
            FROM "{UNIFIED_NET_VIEW}" u
            LEFT JOIN producer_windows w ON w.producer_run = {RUN_OF_MESSAGE}
            WHERE w.producer_run IS NULL OR u.timestamp IS NULL
               OR u.timestamp < w.start_ms - 1 OR u.timestamp > w.end_ms + 1"""
    )
    outside = _scalar(con, "SELECT count(*) FROM outside")
    unknown = _scalar(con, "SELECT count(*) FROM outside WHERE NOT run_known")
    examples = _rows(con, f"SELECT * FROM outside ORDER BY message LIMIT {EXAMPLES}")
    total = _scalar(con, f'SELECT count(*) FROM "{UNIFIED_NET_VIEW}"')
    passed = outside == 0
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else f"{outside} of {total} rows have a timestamp outside their producer run's window"
        + (f" ({unknown} of them from no known producer run)" if unknown else ""),
        metadata={
            "rows": int(total),
            "rows_outside_window": int(outside),
            "rows_of_unknown_run": int(unknown),
            "producer_runs": windows.num_rows,
            "examples": _examples(examples),
        },
    )


def schema_matches_contract(lk: Lake, con: Any, registered: list[str]) -> AssetCheckResult:
    if (missing := _missing_unified(lk, registered)) is not None:
        return missing
    actual = {r["column_name"]: r["column_type"] for r in _rows(con, f'DESCRIBE "{UNIFIED_TABLE}"')}
    bad_diff = (
        _scalar(con, f'SELECT count(*) FROM "{UNIFIED_TABLE}" WHERE diff NOT IN (1, -1)')
        if actual.get("diff") == "BIGINT"
        else 0
    )
    problems = []
    for col, typ in CONTRACT_SQL_TYPES.items():
        if col not in actual:
            problems.append({"column": col, "expected": typ, "actual": "missing"})
        elif actual[col] != typ:
            problems.append({"column": col, "expected": typ, "actual": actual[col]})
    for col in actual:
        if col not in CONTRACT_SQL_TYPES:
            problems.append({"column": col, "expected": "absent", "actual": actual[col]})
    if bad_diff:
        problems.append(
            {"column": "diff", "expected": "+1 or -1", "actual": f"{bad_diff} other values"}
        )
    passed = not problems
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else "schema differs from the contract: "
        + "; ".join(
            f"{p['column']}: expected {p['expected']}, got {p['actual']}" for p in problems
        ),
        metadata={
            "columns": MetadataValue.md(
                markdown_table([{"column": c, "type": t} for c, t in actual.items()])
            ),
            "problems": _examples(problems),
        },
    )


def rejects_count(lk: Lake, con: Any, registered: list[str]) -> AssetCheckResult:
    if REJECTS_TABLE not in registered:
        count, by_reason, examples = 0, [], []
    else:
        count = _scalar(con, f'SELECT count(*) FROM "{REJECTS_TABLE}"')
        by_reason = _rows(
            con,
            f'SELECT source_table, reason, count(*) AS rows FROM "{REJECTS_TABLE}" '
            "GROUP BY ALL ORDER BY rows DESC LIMIT 20",
        )
        examples = _rows(
            con,
            "SELECT source_table, source_version, message, date, reason "
            f'FROM "{REJECTS_TABLE}" ORDER BY time DESC LIMIT {EXAMPLES}',
        )
    passed = count == 0
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.WARN,
        description=None if passed else f"{count} input rows were rejected by the ETL",
        metadata={
            "rejected_rows": int(count),
            "by_reason": _examples(by_reason),
            "examples": _examples(examples),
        },
    )


# name -> (check, description, blocking): one check spec of `unified_checks` each.
CHECKS: dict[str, tuple[Callable[[Lake, Any, list[str]], AssetCheckResult], str, bool]] = {
    "no_message_lost": (
        no_message_lost,
        "Every message in the inputs' current content is in timezone_unified's net content, "
        "and nothing else is (messages with sum(diff) > 0 = input rows). Blocking.",
        True,
    ),
    "no_duplicate_message": (
        no_duplicate_message,
        "No message is in timezone_unified's net content twice, and none is retracted more "
        "often than inserted (sum(diff) per message is 0 or 1). Blocking.",
        True,
    ),
    "no_nulls": (
        no_nulls,
        "No null in any column of timezone_unified (Great Expectations suite).",
        False,
    ),
    "timestamp_in_producer_window": (
        timestamp_in_producer_window,
        "Every `timestamp` of timezone_unified's net content lies inside the time window its "
        "producer run scheduled (from the producer's commit metadata).",
        False,
    ),
    "schema_matches_contract": (
        schema_matches_contract,
        "Columns and types match the contract: timestamp double, message string, time int64, "
        "diff int64 (DuckDB DESCRIBE), and diff is +1 or -1. Blocking.",
        True,
    ),
    "rejects_count": (
        rejects_count,
        "Rows the ETL could not parse (the rejects table); warns when there are any.",
        False,
    ),
}


@multi_asset_check(
    specs=[
        AssetCheckSpec(name, asset=UNIFIED_TABLE, description=description, blocking=blocking)
        for name, (_, description, blocking) in CHECKS.items()
    ],
    can_subset=True,
    description="The data-quality checks of timezone_unified in one step: each table is read "
    "from the lake once into DuckDB, then every selected check queries it there.",
)
def unified_checks(
    context: AssetCheckExecutionContext, lake: LakeResource, duck: DuckDBResource
) -> Iterator[AssetCheckResult]:
    names = sorted(key.name for key in context.selected_asset_check_keys)
    yield from evaluate_checks(lake.lake(), duck, names)


def evaluate_checks(lk: Lake, duck: DuckDBResource, names: list[str]) -> Iterator[AssetCheckResult]:
    """The named checks over one DuckDB connection with each table read once."""
    with delta_views(duck, lk, (*INPUT_TABLES, UNIFIED_TABLE, REJECTS_TABLE), load=True) as con:
        registered = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE temporary "
                "UNION SELECT view_name FROM duckdb_views() WHERE temporary"
            ).fetchall()
        ]
        for name in names:
            check, _, _ = CHECKS[name]
            started = time.perf_counter()
            result = check(lk, con, registered)
            seconds = round(time.perf_counter() - started, 3)
            yield AssetCheckResult(
                asset_key=UNIFIED_TABLE,
                check_name=name,
                passed=result.passed,
                severity=result.severity,
                description=result.description,
                metadata={**(result.metadata or {}), "check_seconds": seconds},
            )


UNIFIED_CHECKS = [unified_checks]
