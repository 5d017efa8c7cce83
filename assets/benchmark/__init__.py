"""The benchmark (`deltabus bench`) as an asset, its job and its nightly schedule."""

from dagster import Definitions

from assets.benchmark.assets import benchmark_report
from assets.benchmark.jobs import benchmark_job, nightly_benchmark_schedule

defs = Definitions(
    assets=[benchmark_report], jobs=[benchmark_job], schedules=[nightly_benchmark_schedule]
)
