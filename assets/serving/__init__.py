"""Serving the unified stream: PostgreSQL and OpenSearch, each an asset with its checks."""

from dagster import Definitions

from assets.serving.opensearch import INDEXING_CHECKS, indexed_unified
from assets.serving.postgres import SERVING_CHECKS, served_unified

defs = Definitions(
    assets=[served_unified, indexed_unified], asset_checks=[*SERVING_CHECKS, *INDEXING_CHECKS]
)
