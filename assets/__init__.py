"""Dagster assets, asset checks, jobs, sensors and schedules of deltabus."""

from assets.automation import (
    benchmark_job,
    etl_service_health,
    etl_service_sensor,
    hourly_maintenance_schedule,
    nightly_benchmark_schedule,
    pipeline_job,
    producer_run_job,
    unified_commits_sensor,
)
from assets.benchmark import benchmark_report
from assets.checks import UNIFIED_CHECKS
from assets.indexing import INDEXING_CHECKS, indexed_unified
from assets.latency import latency_percentiles, p99_within_limit
from assets.operations import etl_service_start_job, etl_service_stop_job, maintenance_job
from assets.serving import SERVING_CHECKS, served_unified
from assets.streams import consumer_groups_within_lag, declared_streams, streams_sensor
from assets.tables import results_csv, stream_window

ASSETS = [
    stream_window,
    results_csv,
    latency_percentiles,
    benchmark_report,
    served_unified,
    indexed_unified,
    declared_streams,
]
ASSET_CHECKS = [
    *UNIFIED_CHECKS,
    p99_within_limit,
    etl_service_health,
    *SERVING_CHECKS,
    *INDEXING_CHECKS,
    consumer_groups_within_lag,
]
JOBS = [
    pipeline_job,
    producer_run_job,
    benchmark_job,
    maintenance_job,
    etl_service_start_job,
    etl_service_stop_job,
]
SENSORS = [unified_commits_sensor, etl_service_sensor, streams_sensor]
SCHEDULES = [nightly_benchmark_schedule, hourly_maintenance_schedule]

__all__ = ["ASSETS", "ASSET_CHECKS", "JOBS", "SCHEDULES", "SENSORS"]
