"""The benchmark's job and its nightly schedule."""

from dagster import AssetSelection, DefaultScheduleStatus, ScheduleDefinition, define_asset_job

benchmark_job = define_asset_job(
    "benchmark_job",
    selection=AssetSelection.assets("benchmark_report"),
    description="The latency benchmark (`deltabus bench`) with its report and plots.",
    # Cancelled after 2 h by run monitoring (enabled in platform/dagster.yaml).
    tags={"dagster/max_runtime": "7200"},
)


nightly_benchmark_schedule = ScheduleDefinition(
    name="nightly_benchmark_schedule",
    job=benchmark_job,
    cron_schedule="0 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    run_config={
        "ops": {
            "benchmark_report": {
                "config": {"rates": "10000,30000", "duration_s": 60, "warmup_s": 10}
            }
        }
    },
    description="The benchmark every night at 03:00 UTC (10k and 30k msg/s, 60 s each).",
)
