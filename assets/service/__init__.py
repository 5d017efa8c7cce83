"""The continuous ETL service: its health checks, its sensor, its start and stop jobs."""

from dagster import Definitions

from assets.service.automation import (
    etl_service_health,
    etl_service_sensor,
    etl_service_start_job,
    etl_service_stop_job,
)

defs = Definitions(
    asset_checks=[etl_service_health],
    jobs=[etl_service_start_job, etl_service_stop_job],
    sensors=[etl_service_sensor],
)
