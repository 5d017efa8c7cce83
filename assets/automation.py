"""Jobs, sensors and schedules."""

import json

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
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
    multi_asset_check,
    sensor,
)

from assets.common import PRODUCER_RUNS, table_rows
from assets.latency import LATENCY_ASSET
from assets.operations import maintenance_job
from deltabus.errors import DeltabusError
from deltabus.etl.positions import recorded_finished_runs
from deltabus.lake import INPUT_TABLES, UNIFIED_TABLE
from deltabus.partitions import read_layout
from deltabus.service import lag, other_live_etl
from resources.etl import REPO_ROOT, EtlServiceResource
from resources.lake import LakeResource

SERVICE_ALIVE_CHECK = "etl_service_alive"
LAG_CHECK = "etl_lag_within_limit"
# Runs of pipeline_job and the checks job do not judge the service (it may not be in use).
SERVICE_CHECKS = AssetSelection.checks(
    *(AssetCheckKey(AssetKey(UNIFIED_TABLE), n) for n in (SERVICE_ALIVE_CHECK, LAG_CHECK))
)

pipeline_job = define_asset_job(
    "pipeline_job",
    selection=AssetSelection.assets(*INPUT_TABLES, UNIFIED_TABLE, "results_csv") - SERVICE_CHECKS,
    description="One stream window: the Pathway ETL tails both inputs while the producer "
    "writes them (streaming; `mode: batch` runs the ETL after the producer), every check on "
    "timezone_unified (loss, duplicates and schema block the CSV export), then the CSV. The "
    "producer run's latency is the producer_runs partition of latency_percentiles "
    "(producer_run_job; `make demo` runs it next, the unified_commits_sensor otherwise).",
    # One process for every step: on a 2-core machine a process per step (Dagster's
    # default) spends more time importing than working, and the steps are sequential.
    executor_def=in_process_executor,
)

producer_run_job = define_asset_job(
    "producer_run_job",
    selection=(AssetSelection.checks_for_assets(UNIFIED_TABLE) - SERVICE_CHECKS)
    | AssetSelection.assets(LATENCY_ASSET),
    description="Once per producer run (partition = its run id): the checks of "
    "timezone_unified and that run's latency percentiles with their check. Requested by the "
    "unified_commits_sensor when the run's finish marker reaches timezone_unified.",
    executor_def=in_process_executor,
)

benchmark_job = define_asset_job(
    "benchmark_job",
    selection=AssetSelection.assets("benchmark_report"),
    description="The latency benchmark (`deltabus bench`) with its report and plots.",
    # Cancelled after 2 h by run monitoring (enabled in platform/dagster.yaml).
    tags={"dagster/max_runtime": "7200"},
)


# Producer runs a sensor cursor remembers (the newest): older ones are long done.
REMEMBERED_RUNS = 500


@sensor(
    job=producer_run_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description="Once per producer run, when the ETL has written that run's last message "
    "(its finish marker reached timezone_unified): adds the run to the producer_runs "
    "partitions and requests producer_run_job for it (run key = lake root + run id). Runs "
    "whose latency partition is already materialized (make demo) are not requested again.",
)
def unified_commits_sensor(context: SensorEvaluationContext, lake: LakeResource):
    lk = lake.lake()
    layout = read_layout(lk)
    present = [t for t in layout.unified_tables if lk.exists(t)]
    if not present:
        return SkipReason(f"no table at {lk.uri(layout.unified_tables[0])} yet")
    finished: dict[str, set[str]] = {}
    for table in present:  # every partition records the runs finished in its inputs
        for source, runs in recorded_finished_runs(lk.open(table)).items():
            finished.setdefault(source, set()).update(runs)
    # A run is finished when its last message reached the output from every input table.
    complete = set.intersection(*(finished.get(t, set()) for t in layout.input_tables))
    done = json.loads(context.cursor) if context.cursor else []
    new = sorted(complete - set(done))
    if not new:
        return SkipReason(
            f"no producer run finished since the last request ({len(complete)} finished)"
        )
    measured = context.instance.get_materialized_partitions(AssetKey(LATENCY_ASSET))
    known = set(context.instance.get_dynamic_partitions(PRODUCER_RUNS.name or ""))
    unknown = [run for run in new if run not in known]
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"{lk.root}:{run}",
                partition_key=run,
                tags={"deltabus/producer_run": run},
            )
            for run in new
            if run not in measured
        ],
        dynamic_partitions_requests=[PRODUCER_RUNS.build_add_request(unknown)] if unknown else [],
        cursor=json.dumps((done + new)[-REMEMBERED_RUNS:]),
    )


@multi_asset_check(
    specs=[
        AssetCheckSpec(
            SERVICE_ALIVE_CHECK,
            asset=UNIFIED_TABLE,
            description="The continuous ETL service is running (when it is enabled).",
        ),
        AssetCheckSpec(
            LAG_CHECK,
            asset=UNIFIED_TABLE,
            description="timezone_unified is at most EtlServiceResource.lag_limit_s behind "
            "the inputs' oldest unprocessed commit.",
        ),
    ],
    description="Health of the continuous ETL service; the etl_service_sensor reports the same "
    "two checks without a run whenever their outcome or the table changes.",
)
def etl_service_health(lake: LakeResource, etl_service: EtlServiceResource):
    status = etl_service.service().status()
    yield from _health_checks(status.alive, status.enabled, lag(lake.lake()), etl_service)


def _health_checks(
    alive: bool, enabled: bool, lagging: dict | None, etl_service: EtlServiceResource
) -> list[AssetCheckResult]:
    max_lag = float(lagging["max_lag_s"]) if lagging else None
    return [
        AssetCheckResult(
            asset_key=UNIFIED_TABLE,
            check_name=SERVICE_ALIVE_CHECK,
            passed=alive or not enabled,
            severity=AssetCheckSeverity.WARN,
            description="running" if alive else ("stopped" if enabled else "not enabled"),
            metadata={"alive": alive, "enabled": enabled},
        ),
        AssetCheckResult(
            asset_key=UNIFIED_TABLE,
            check_name=LAG_CHECK,
            passed=max_lag is not None and max_lag <= etl_service.lag_limit_s,
            severity=AssetCheckSeverity.WARN,
            description=f"lag {max_lag} s (limit {etl_service.lag_limit_s:g} s)",
            metadata={"max_lag_s": max_lag if max_lag is not None else -1.0},
        ),
    ]


@sensor(
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description="Watches the continuous ETL service: records its new commits to "
    "timezone_unified as materializations (runless), reports its health checks when they "
    "change, and relaunches the service when it died after etl_service_start_job started "
    "it (not after etl_service_stop_job).",
)
def etl_service_sensor(
    context: SensorEvaluationContext, lake: LakeResource, etl_service: EtlServiceResource
):
    service = etl_service.service()
    status = service.status()
    lk = lake.lake()
    try:
        lagging = lag(lk)
    except DeltabusError as exc:
        context.log.warning(f"cannot read the lag: {exc}")
        lagging = None
    restarted = False
    fenced_by = None
    if status.enabled and not status.alive:
        fenced_by = other_live_etl(lk, status.pids)
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
    before = json.loads(context.cursor) if context.cursor else {}
    events: list = []
    version = lagging["unified_version"] if lagging else None
    if version is not None and version != before.get("version"):
        versions = lagging["unified_versions"]
        metadata = {
            "mode": "service",
            # The table's version; with P partitions, the sum of theirs (each is listed).
            "delta_version": int(version),
            "partitions": int(lagging["partitions"]),
            "etl_processes": len(status.pids),
            "dagster/row_count": sum(table_rows(lk.open(t)) for t in versions),
            "max_lag_s": float(lagging["max_lag_s"]),
            "data_commits_behind": int(lagging["data_commits_behind"]),
            "service_alive": status.alive,
            "service_restarted": restarted,
            "service_restarts": status.restarts,
            "held_by_other_etl": fenced_by or "",
        }
        if len(versions) > 1:
            for table, v in versions.items():
                metadata[f"{table}_version"] = int(v)
        for table, t in lagging["tables"].items():  # per input partition
            metadata[f"{table}_position"] = int(t["processed_version"])
            metadata[f"{table}_versions_behind"] = int(t["versions_behind"])
            metadata[f"{table}_lag_s"] = float(t["lag_s"])
        events.append(AssetMaterialization(asset_key=UNIFIED_TABLE, metadata=metadata))
    checks = _health_checks(status.alive, status.enabled, lagging, etl_service)
    outcome = [c.passed for c in checks]
    if events or outcome != before.get("checks"):
        events += [
            AssetCheckEvaluation(
                asset_key=c.asset_key,
                check_name=c.check_name,
                passed=c.passed,
                severity=c.severity,
                description=c.description,
                metadata=c.metadata,
            )
            for c in checks
        ]
    summary = (
        f"service {'alive' if status.alive else 'not running'}"
        f"{' (relaunched)' if restarted else ''}"
        f"{'' if status.enabled else ', not enabled'}"
        + (f", held by {fenced_by}" if fenced_by else "")
        + (
            f"; lag {lagging['max_lag_s']}s, {lagging['data_commits_behind']} commits behind"
            if lagging
            else ""
        )
    )
    context.log.info(summary)
    if not events:
        return SkipReason(summary)
    return SensorResult(
        asset_events=events,
        cursor=json.dumps({"version": version, "checks": outcome}),
        skip_reason=SkipReason(summary),
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
