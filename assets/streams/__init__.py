"""Declared streams as an asset, consumer groups' lag as its check, and their sensor."""

from dagster import Definitions

from assets.streams.assets import consumer_groups_within_lag, declared_streams, streams_sensor

defs = Definitions(
    assets=[declared_streams], asset_checks=[consumer_groups_within_lag], sensors=[streams_sensor]
)
