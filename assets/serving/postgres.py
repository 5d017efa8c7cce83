"""The unified stream served in PostgreSQL: an asset that catches the served table up,
and checks that it equals timezone_unified's net content and how far behind it runs.

The asset runs the serving sink once (`deltabus serve postgres --once`): it applies every
unified commit up to the version current at start, each run of commits in one
transaction with the sink's position, so a retried or concurrent materialization never
applies a commit twice. A continuously running sink (`deltabus serve postgres --follow`)
keeps the same table current; the checks judge either.
"""

from dagster import (
    AssetExecutionContext,
    MaterializeResult,
    asset,
)

from assets.common import OWNERS, PIPELINE_GROUP
from assets.serving.checks import ServedCopy, build_serving_checks
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


SERVING_CHECKS = build_serving_checks(
    ServedCopy(
        asset=SERVED_ASSET,
        verb="served",
        resource_key="postgres",
        noun="the served table",
        entries="rows",
        count_key="served_rows",
        count_check="served_row_count_matches_unified",
        compare=lambda lake, pg: compare(lake, pg.dsn, pg.served_table()),
        lag=lambda lake, pg: serving_lag(lake, pg.dsn, pg.served_table()),
    )
)
