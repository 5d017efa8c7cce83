"""Lake maintenance: the op, its job and its hourly schedule."""

from dagster import (
    AssetObservation,
    Config,
    DefaultScheduleStatus,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)
from dagster_aws.s3 import S3Resource
from pydantic import Field

from assets.common import markdown_table
from deltabus.apps.timezones.contracts import INPUT_TABLES, PIPELINE_TABLES, UNIFIED_TABLE
from deltabus.bus.client import Bus
from deltabus.delta.maintenance import maintain
from deltabus.delta.retention import RetentionPolicy
from resources.lake import LakeResource
from resources.s3 import list_table_objects

ASSET_TABLES = (*INPUT_TABLES, UNIFIED_TABLE)


class MaintenanceConfig(Config):
    retention_hours: float = Field(
        default=24.0,
        description="Vacuum files older than this; must exceed the slowest reader's lag.",
    )
    tables: list[str] = Field(default=list(PIPELINE_TABLES), description="Tables to maintain.")
    streams: bool = Field(
        default=True,
        description="Also every declared stream, as its settings ask (retention, compaction).",
    )


@op(
    description="Drop records past their retention, compact small files, checkpoint the "
    "Delta log and vacuum old files."
)
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
    bus = Bus(lk)
    streams = [bus.stream(n) for n in bus.streams()] if config.streams else []
    in_streams = {t for stream in streams for t in stream.tables}
    tables = tuple(t for t in config.tables if t not in in_streams)
    unified = RetentionPolicy(max_age_s=lk.settings.unified_retention_s)  # a setting
    results = maintain(lk, tables, config.retention_hours, retention={UNIFIED_TABLE: unified})
    if streams:  # each as its own settings ask (deltabus.bus.maintenance)
        done = bus.maintain(vacuum_retention_hours=config.retention_hours)
        results += [table for stream in done for table in stream.tables]
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
                        "files_removed_by_retention": r.retention_files_removed,
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


@job(
    description="Hourly lake maintenance: retention, compaction, checkpoints, vacuum (vacuum's "
    "retention in run config)."
)
def maintenance_job():
    maintain_lake()


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
