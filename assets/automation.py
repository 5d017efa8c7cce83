"""Jobs, sensors and schedules."""

from dagster import (
    AssetObservation,
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    ScheduleDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    in_process_executor,
    sensor,
)

from assets.common import table_rows
from assets.latency import LATENCY_ASSET
from assets.operations import maintenance_job
from deltabus.errors import DeltabusError
from deltabus.lake import INPUT_TABLES, UNIFIED_TABLE
from deltabus.service import lag, other_live_etl
from resources.etl import REPO_ROOT, EtlServiceResource
from resources.lake import LakeResource

pipeline_job = define_asset_job(
    "pipeline_job",
    selection=AssetSelection.assets(*INPUT_TABLES, UNIFIED_TABLE, "results_csv", LATENCY_ASSET),
    description="The whole flow once: produce both inputs, bounded ETL, CSV export, "
    "latency percentiles, and every check on them.",
    # One process for every step: on a 2-core machine a process per step (Dagster's
    # default) spends more time importing than working, and the steps are sequential.
    executor_def=in_process_executor,
)

unified_checks_job = define_asset_job(
    "unified_checks_job",
    selection=AssetSelection.checks_for_assets(UNIFIED_TABLE)
    | AssetSelection.assets(LATENCY_ASSET),
    description="The checks of timezone_unified and the latency percentiles (with their check), "
    "without producing or running the ETL: what the unified_commits_sensor runs.",
    executor_def=in_process_executor,
)

benchmark_job = define_asset_job(
    "benchmark_job",
    selection=AssetSelection.assets("benchmark_report"),
    description="The latency benchmark (`deltabus bench`) with its report and plots.",
    # Cancelled after 2 h by run monitoring (enabled in platform/dagster.yaml).
    tags={"dagster/max_runtime": "7200"},
)


@sensor(
    job=unified_checks_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description="Watches timezone_unified's Delta version; on new commits records an "
    "observation (version, rows) and runs the checks and latency percentiles.",
)
def unified_commits_sensor(context: SensorEvaluationContext, lake: LakeResource):
    lk = lake.lake()
    if not lk.exists(UNIFIED_TABLE):
        return SkipReason(f"no table at {lk.uri(UNIFIED_TABLE)} yet")
    dt = lk.open(UNIFIED_TABLE)
    version = dt.version()
    last = int(context.cursor) if context.cursor else None
    if last == version:
        return SkipReason(f"no new commit since version {version}")
    rows = table_rows(dt)
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"{lk.root}@{version}",
                tags={"deltabus/unified_version": str(version)},
            )
        ],
        asset_events=[
            AssetObservation(
                asset_key=UNIFIED_TABLE,
                metadata={
                    "delta_version": version,
                    "rows": rows,
                    "previous_version": -1 if last is None else last,
                },
            )
        ],
        cursor=str(version),
    )


@sensor(
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description="Watches the continuous ETL service: reports how far timezone_unified is "
    "behind the inputs, and relaunches the service when it died after etl_service_start_job "
    "started it (not after etl_service_stop_job).",
)
def etl_service_sensor(
    context: SensorEvaluationContext, lake: LakeResource, etl_service: EtlServiceResource
):
    service = etl_service.service()
    status = service.status()
    events = []
    lk = lake.lake()
    try:
        lagging = lag(lk)
    except DeltabusError as exc:
        context.log.warning(f"cannot read the lag: {exc}")
        lagging = None
    restarted = False
    fenced_by = None
    if status.enabled and not status.alive:
        fenced_by = other_live_etl(lk, status.pid)
        if fenced_by:
            # Relaunching would fence that ETL in turn: two writers taking turns.
            context.log.warning(
                f"the ETL service (pid {status.pid}) is not running: another ETL holds "
                f"timezone_unified ({fenced_by}); not relaunching while it runs"
            )
        else:
            context.log.warning(
                f"the ETL service (pid {status.pid}) is not running; relaunching it. "
                f"Last log lines:\n{service.log_tail(10)}"
            )
            status = service.restart(env=lake.subprocess_env(), cwd=REPO_ROOT)
            restarted = True
    if lagging is not None and lagging["unified_version"] is not None:
        metadata = {
            "service_alive": status.alive,
            "service_enabled": status.enabled,
            "service_restarted": restarted,
            "service_restarts": status.restarts,
            "held_by_other_etl": fenced_by or "",
            "max_lag_s": float(lagging["max_lag_s"]),
            "data_commits_behind": int(lagging["data_commits_behind"]),
            "delta_version": int(lagging["unified_version"]),
        }
        for table, t in lagging["tables"].items():
            metadata[f"{table}_versions_behind"] = int(t["versions_behind"])
        events.append(AssetObservation(asset_key=UNIFIED_TABLE, metadata=metadata))
    summary = (
        f"service {'alive' if status.alive else 'not running'}"
        f"{' (relaunched)' if restarted else ''}"
        f"{'' if status.enabled else ', not enabled'}"
        + (
            f"; lag {lagging['max_lag_s']}s, {lagging['data_commits_behind']} commits behind"
            if lagging
            else ""
        )
    )
    context.log.info(summary)
    if not events:
        return SkipReason(summary)
    return SensorResult(asset_events=events, skip_reason=SkipReason(summary))


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

hourly_maintenance_schedule = ScheduleDefinition(
    name="hourly_maintenance_schedule",
    job=maintenance_job,
    cron_schedule="0 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    run_config={"ops": {"maintain_lake": {"config": {"retention_hours": 24.0}}}},
    description="Compact, checkpoint and vacuum every hour (retention 24 h; change it in the "
    "run config).",
)
