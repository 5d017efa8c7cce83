"""The unified stream indexed in OpenSearch: an asset that catches the index up, and
checks that it equals timezone_unified's net content and how far behind it runs.

The asset runs the index sink once (`deltabus serve opensearch --once`): it applies every
unified commit up to the version current at start, each write versioned by the unified
version, so a retried or concurrent materialization never applies a commit twice in
effect. A continuously running sink (`deltabus serve opensearch --follow`) keeps the same
index current; the checks judge either.
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


def _difference(lake: LakeResource, opensearch: OpenSearchResource) -> dict:
    return compare_index(lake.lake(), opensearch.url, opensearch.served_index())


@asset_check(
    asset=INDEXED_ASSET,
    description="The index holds as many documents as timezone_unified's net content has rows.",
)
def indexed_count_matches_unified(
    lake: LakeResource, opensearch: OpenSearchResource
) -> AssetCheckResult:
    diff = _difference(lake, opensearch)
    passed = diff["served_rows"] == diff["unified_net_rows"]
    return AssetCheckResult(
        passed=passed,
        description=None
        if passed
        else f"{diff['served_rows']} documents indexed, {diff['unified_net_rows']} rows in "
        "timezone_unified's net content: run indexed_unified (or the sink) to catch up",
        metadata={
            "indexed_docs": diff["served_rows"],
            "unified_net_rows": diff["unified_net_rows"],
        },
    )


@asset_check(
    asset=INDEXED_ASSET,
    description="The index's messages (and their timestamps) are exactly those of "
    "timezone_unified's net content: none missing, none extra.",
)
def indexed_messages_match_unified(
    lake: LakeResource, opensearch: OpenSearchResource
) -> AssetCheckResult:
    diff = _difference(lake, opensearch)
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


class IndexedLagConfig(Config):
    lag_limit_s: float = Field(
        default=60.0,
        description="Warn when the index misses unified commits older than this (s).",
    )


@asset_check(
    asset=INDEXED_ASSET,
    name="indexed_lag_within_limit",
    description="How far the index runs behind timezone_unified: the age of the oldest "
    "unified commit it does not hold yet (0 when it holds them all).",
)
def indexed_lag_within_limit(
    config: IndexedLagConfig,
    lake: LakeResource,
    opensearch: OpenSearchResource,
) -> AssetCheckResult:
    lag = index_lag(lake.lake(), opensearch.url, opensearch.served_index())
    passed = lag["lag_s"] is not None and lag["lag_s"] <= config.lag_limit_s
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.WARN,
        description=None
        if passed
        else f"{lag['versions_behind']} unified versions not indexed, the oldest "
        f"{lag['lag_s']} s old (limit {config.lag_limit_s:g} s)",
        metadata={k: lag[k] for k in ("position", "unified_version", "versions_behind", "lag_s")},
    )


INDEXING_CHECKS = [
    indexed_count_matches_unified,
    indexed_messages_match_unified,
    indexed_lag_within_limit,
]
