"""The unified stream indexed in OpenSearch: an asset that catches the index up, and
checks that it equals timezone_unified's net content and how far behind it runs.

The asset runs the index sink once (`deltabus serve opensearch --once`): it applies every
unified commit up to the version current at start, each write versioned by the unified
version, so a retried or concurrent materialization never applies a commit twice in
effect. A continuously running sink (`deltabus serve opensearch --follow`) keeps the same
index current; the checks judge either.
"""

from dagster import (
    AssetExecutionContext,
    MaterializeResult,
    asset,
)

from assets.common import OWNERS, PIPELINE_GROUP
from assets.serving.checks import ServedCopy, build_serving_checks
from deltabus.adapters.serving.opensearch import OpenSearchSink
from deltabus.adapters.serving.opensearch_compare import compare_index, index_lag
from deltabus.adapters.serving.sink_loop import ServeConfig
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from resources.lake import LakeResource
from resources.opensearch import OpenSearchResource

INDEXED_ASSET = "indexed_unified"


@asset(
    name=INDEXED_ASSET,
    group_name=PIPELINE_GROUP,
    deps=[UNIFIED_TABLE],
    kinds={"opensearch", "python"},
    owners=OWNERS,
    description="timezone_unified's net content in an OpenSearch index (one document per "
    "message; retractions delete, insertions index), kept exactly once in effect by the "
    "index sink: every write carries the unified version as its external version, and "
    "the sink's position is a document written after each batch.",
)
def indexed_unified(
    context: AssetExecutionContext, lake: LakeResource, opensearch: OpenSearchResource
) -> MaterializeResult:
    config = ServeConfig(table=opensearch.served_index(), follow=False)
    report = OpenSearchSink(lake.lake(check=True), opensearch.url, config).run()
    context.log.info(
        f"{opensearch.describe()}: version {report.version}, {report.indexed_docs} documents "
        f"({report.batches} batches, {report.docs_indexed} indexed, {report.docs_deleted} "
        f"deleted, {report.already_applied} already applied)"
    )
    return MaterializeResult(
        metadata={
            "dagster/row_count": int(report.indexed_docs or 0),
            "version": report.version,
            "unified_version": report.unified_version,
            "lag_s": report.lag_s,
            "batches": report.batches,
            "docs_indexed": report.docs_indexed,
            "docs_deleted": report.docs_deleted,
            "already_applied": report.already_applied,
            "snapshot_docs": report.snapshot_docs,
            "opensearch": opensearch.describe(),
        }
    )


INDEXING_CHECKS = build_serving_checks(
    ServedCopy(
        asset=INDEXED_ASSET,
        verb="indexed",
        resource_key="opensearch",
        noun="the index",
        entries="documents",
        count_key="indexed_docs",
        count_check="indexed_count_matches_unified",
        compare=lambda lake, os: compare_index(lake, os.url, os.served_index()),
        lag=lambda lake, os: index_lag(lake, os.url, os.served_index()),
    )
)
