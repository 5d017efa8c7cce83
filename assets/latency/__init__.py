"""Latency percentiles per producer run, and their p99 check."""

from dagster import Definitions

from assets.latency.assets import latency_percentiles, p99_within_limit

defs = Definitions(assets=[latency_percentiles], asset_checks=[p99_within_limit])
