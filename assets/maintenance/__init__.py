"""Lake maintenance: compaction, checkpoints, log cleanup and vacuum, hourly."""

from dagster import Definitions

from assets.maintenance.jobs import hourly_maintenance_schedule, maintenance_job

defs = Definitions(jobs=[maintenance_job], schedules=[hourly_maintenance_schedule])
