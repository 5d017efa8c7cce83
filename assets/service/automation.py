"""The continuous ETL service: its health checks, the sensor that watches and relaunches
it, and the jobs that start and stop it."""

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
    Config,
    DefaultSensorStatus,
    Failure,
    MetadataValue,
    OpExecutionContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    job,
    multi_asset_check,
    op,
    sensor,
)
from pydantic import Field

from assets.common import table_rows
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.service import lag, other_live_etl
from deltabus.core.errors import DeltabusError
from deltabus.core.paths import REPO_ROOT
from deltabus.core.processes import wait_for_file
from resources.etl import EtlServiceResource
from resources.lake import LakeResource

SERVICE_ALIVE_CHECK = "etl_service_alive"
LAG_CHECK = "etl_lag_within_limit"
# Runs of pipeline_job and the checks job do not judge the service (it may not be in use).
SERVICE_CHECKS = AssetSelection.checks(
    *(AssetCheckKey(AssetKey(UNIFIED_TABLE), n) for n in (SERVICE_ALIVE_CHECK, LAG_CHECK))
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


class StartServiceConfig(Config):
    ready_timeout_s: float = Field(
        default=120, description="How long to wait for the ETL dataflow to be running."
    )


@op(description="Start the continuous ETL (`deltabus etl --mode continuous`) detached.")
def start_etl_service(
    context: OpExecutionContext,
    config: StartServiceConfig,
    lake: LakeResource,
    etl_service: EtlServiceResource,
) -> None:
    service = etl_service.service()
    status = service.status()
    if status.alive:
        context.log.info(f"the ETL service is already running (pid {status.pid})")
        return
    lk = lake.lake(check=True)
    status = service.start(
        env=lake.subprocess_env(),
        etl_args=etl_service.etl_args(),
        prefix=lk.settings.prefix,
        cwd=REPO_ROOT,
        ready=True,
    )
    try:
        for ready in service.ready_files:  # one per ETL process
            wait_for_file(
                ready,
                lambda: service.status().alive,
                what="the ETL service",
                timeout=config.ready_timeout_s,
                interval=0.2,
            )
    except DeltabusError as exc:
        raise Failure(
            str(exc),
            metadata={"log_tail": MetadataValue.md("```\n" + service.log_tail(30) + "\n```")},
        ) from None
    context.log.info(
        f"ETL service running (pids {', '.join(map(str, status.pids))}) on "
        f"{lk.settings.describe()}; log: {status.log_file}"
    )


@op(description="Stop the continuous ETL service (SIGTERM; it commits what it has, then exits).")
def stop_etl_service(context: OpExecutionContext, etl_service: EtlServiceResource) -> None:
    service = etl_service.service()
    before = service.status()
    status = service.stop()
    if status.alive:
        raise Failure(f"the ETL service (pid {status.pid}) did not stop")
    context.log.info(
        f"ETL service stopped (was pid {before.pid})"
        if before.alive
        else "the ETL service was not running"
    )


@job(description="Start the continuous ETL service; the etl_service_sensor restarts it if it dies.")
def etl_service_start_job():
    start_etl_service()


@job(description="Stop the continuous ETL service and disable its automatic restart.")
def etl_service_stop_job():
    stop_etl_service()
