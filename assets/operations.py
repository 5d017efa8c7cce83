"""Op jobs: lake maintenance, and starting/stopping the continuous ETL service."""

from dagster import (
    AssetObservation,
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    job,
    op,
)
from dagster_aws.s3 import S3Resource
from pydantic import Field

from assets.common import markdown_table
from deltabus.bus.client import Bus
from deltabus.errors import DeltabusError
from deltabus.lake import INPUT_TABLES, UNIFIED_TABLE
from deltabus.maintenance import DEFAULT_TABLES, maintain
from deltabus.processes import wait_for_file
from resources.etl import REPO_ROOT, EtlServiceResource
from resources.lake import LakeResource
from resources.s3 import list_table_objects

ASSET_TABLES = (*INPUT_TABLES, UNIFIED_TABLE)


class MaintenanceConfig(Config):
    retention_hours: float = Field(
        default=24.0,
        description="Vacuum files older than this; must exceed the slowest reader's lag.",
    )
    tables: list[str] = Field(default=list(DEFAULT_TABLES), description="Tables to maintain.")
    streams: bool = Field(
        default=True, description="Also every table of every stream declared in the lake."
    )


@op(description="Compact small files, checkpoint the Delta log and vacuum old files.")
def maintain_lake(
    context: OpExecutionContext, config: MaintenanceConfig, lake: LakeResource, s3: S3Resource
) -> None:
    lk = lake.lake(check=True)
    listing = None
    if not lk.is_local:
        listing = lambda: list_table_objects(  # noqa: E731
            s3.get_client(), lk.settings.bucket, lk.settings.prefix
        )
    before = listing() if listing else {}
    tables, uncompacted = list(config.tables), set()
    if config.streams:
        bus = Bus(lk)
        for stream in (bus.stream(n) for n in bus.streams()):
            tables += [t for t in stream.tables if t not in tables]
            if not stream.settings.compaction:
                uncompacted.update(stream.tables)
    results = maintain(lk, tuple(tables), config.retention_hours, frozenset(uncompacted))
    after = listing() if listing else {}
    rows = []
    for r in results:
        row = {
            **r.as_dict(),
            "objects_before": before.get(r.table, {}).get("objects"),
            "objects_after": after.get(r.table, {}).get("objects"),
            "bytes_after": after.get(r.table, {}).get("bytes"),
        }
        rows.append(row)
        if r.table in ASSET_TABLES:
            context.log_event(
                AssetObservation(
                    asset_key=r.table,
                    metadata={
                        "delta_version": r.version_after,
                        "files_compacted": r.files_compacted,
                        "files_vacuumed": r.files_vacuumed,
                        "checkpoint_version": r.checkpoint_version,
                        **({"objects": row["objects_after"]} if listing else {}),
                        **({"bytes": row["bytes_after"]} if listing else {}),
                    },
                )
            )
    context.log.info(
        f"maintained {len(results)} tables (retention {config.retention_hours:g} h):\n"
        + markdown_table(rows)
    )


@job(description="Hourly lake maintenance: compact, checkpoint, vacuum (retention in run config).")
def maintenance_job():
    maintain_lake()


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
