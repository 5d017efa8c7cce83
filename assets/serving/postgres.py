"""The unified stream served in PostgreSQL: an asset that catches the served table up,
and checks that it equals timezone_unified's net content and how far behind it runs.

The asset runs the serving sink once (`deltabus serve postgres --once`): it applies every
unified commit up to the version current at start, each run of commits in one
transaction with the sink's position, so a retried or concurrent materialization never
applies a commit twice. A continuously running sink (`deltabus serve postgres --follow`)
keeps the same table current; the checks judge either.
"""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)
from pydantic import Field

from assets.common import OWNERS, PIPELINE_GROUP, markdown_table
from deltabus.adapters.serving.compare import compare, serving_lag
from deltabus.adapters.serving.postgres_sink import PostgresSink, ServeConfig
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from resources.lake import LakeResource
from resources.postgres import PostgresResource

SERVED_ASSET = "served_unified"


@asset(
    name=SERVED_ASSET,
    group_name=PIPELINE_GROUP,
    deps=[UNIFIED_TABLE],
    kinds={"postgres", "python"},
    owners=OWNERS,
    description="timezone_unified's net content in a PostgreSQL table (one row per message; "
    "retractions delete, insertions upsert), kept exactly once by the serving sink: its "
    "position in the unified table commits in the same transaction as the rows.",
)
def served_unified(
    context: AssetExecutionContext, lake: LakeResource, postgres: PostgresResource
) -> MaterializeResult:
    config = ServeConfig(table=postgres.served_table(), follow=False)
    report = PostgresSink(lake.lake(check=True), postgres.dsn, config).run()
    context.log.info(
        f"{postgres.describe()}: version {report.version}, {report.served_rows} rows "
        f"({report.transactions} transactions, {report.rows_upserted} upserted, "
        f"{report.rows_deleted} deleted)"
    )
    return MaterializeResult(
        metadata={
            "dagster/row_count": int(report.served_rows or 0),
            "version": report.version,
            "unified_version": report.unified_version,
            "lag_s": report.lag_s,
            "transactions": report.transactions,
            "rows_upserted": report.rows_upserted,
            "rows_deleted": report.rows_deleted,
            "snapshot_rows": report.snapshot_rows,
            "rows_escaped": report.rows_escaped,
            "postgres": postgres.describe(),
        }
    )


def _difference(lake: LakeResource, postgres: PostgresResource) -> dict:
    return compare(lake.lake(), postgres.dsn, postgres.served_table())


@asset_check(
    asset=SERVED_ASSET,
    description="The served table has as many rows as timezone_unified's net content.",
)
def served_row_count_matches_unified(
    lake: LakeResource, postgres: PostgresResource
) -> AssetCheckResult:
    diff = _difference(lake, postgres)
    passed = diff["served_rows"] == diff["unified_net_rows"]
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else f"{diff['served_rows']} rows served, {diff['unified_net_rows']} in "
        "timezone_unified's net content: run served_unified (or the sink) to catch up",
        metadata={k: diff[k] for k in ("served_rows", "unified_net_rows")},
    )


@asset_check(
    asset=SERVED_ASSET,
    description="The served table's messages (and their timestamps) are exactly those of "
    "timezone_unified's net content: none missing, none extra.",
)
def served_messages_match_unified(
    lake: LakeResource, postgres: PostgresResource
) -> AssetCheckResult:
    diff = _difference(lake, postgres)
    passed = not (diff["missing"] or diff["extra"] or diff["timestamp_mismatches"])
    examples = [{"message": m, "problem": "missing"} for m in diff["missing_examples"]] + [
        {"message": m, "problem": "extra"} for m in diff["extra_examples"]
    ]
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else f"{diff['missing']} messages missing, {diff['extra']} extra, "
        f"{diff['timestamp_mismatches']} with another timestamp",
        metadata={
            "missing": diff["missing"],
            "extra": diff["extra"],
            "timestamp_mismatches": diff["timestamp_mismatches"],
            "examples": MetadataValue.md(markdown_table(examples)),
        },
    )


class ServedLagConfig(Config):
    lag_limit_s: float = Field(
        default=60.0,
        description="Warn when the served table misses unified commits older than this (s).",
    )


@asset_check(
    asset=SERVED_ASSET,
    name="served_lag_within_limit",
    description="How far the served table runs behind timezone_unified: the age of the "
    "oldest unified commit it does not hold yet (0 when it holds them all).",
)
def served_lag_within_limit(
    config: ServedLagConfig,
    lake: LakeResource,
    postgres: PostgresResource,
) -> AssetCheckResult:
    lag = serving_lag(lake.lake(), postgres.dsn, postgres.served_table())
    passed = lag["lag_s"] is not None and lag["lag_s"] <= config.lag_limit_s
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.WARN,
        description=None
        if passed
        else f"{lag['versions_behind']} unified versions not served, the oldest "
        f"{lag['lag_s']} s old (limit {config.lag_limit_s:g} s)",
        metadata={k: lag[k] for k in ("position", "unified_version", "versions_behind", "lag_s")},
    )


SERVING_CHECKS = [
    served_row_count_matches_unified,
    served_messages_match_unified,
    served_lag_within_limit,
]
