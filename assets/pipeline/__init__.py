"""The time-zone pipeline: its tables, their checks, the CSV export, its jobs and the sensor
that measures every producer run."""

from dagster import Definitions

from assets.pipeline.assets import results_csv, stream_window
from assets.pipeline.automation import pipeline_job, producer_run_job, unified_commits_sensor
from assets.pipeline.checks import UNIFIED_CHECKS

defs = Definitions(
    assets=[stream_window, results_csv],
    asset_checks=UNIFIED_CHECKS,
    jobs=[pipeline_job, producer_run_job],
    sensors=[unified_commits_sensor],
)
