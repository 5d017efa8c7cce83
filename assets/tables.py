"""The lake's tables as assets: producer inputs, the Pathway ETL's output, the CSV export."""

import warnings
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    PipesSubprocessClient,
    asset,
    multi_asset,
)
from dagster_aws.s3 import S3Resource
from pydantic import Field

from assets.common import PIPELINE_GROUP, table_rows
from deltabus.intervals import DEFAULT_COMMIT_INTERVAL_MS, DEFAULT_POLL_INTERVAL_MS, from_ms
from deltabus.lake import INPUT_TABLES, TABLE_ZONES, UNIFIED_TABLE
from deltabus.processes import etl_command
from deltabus.producer import Producer
from deltabus.producer import ProducerConfig as EngineProducerConfig
from deltabus.results import export_results
from resources.etl import PIPES_INTERNAL_WARNING, EtlServiceResource
from resources.lake import LakeResource
from resources.s3 import ensure_bucket


class ProduceConfig(Config):
    """Run config of the producer (small defaults: a demo, not a benchmark)."""

    rate: float = Field(default=2000, description="Messages per second (open-loop schedule).")
    duration_s: float = Field(default=5.0, description="Seconds to produce for.")
    commit_interval_ms: float = Field(
        default=DEFAULT_COMMIT_INTERVAL_MS, description="One commit per table per interval (ms)."
    )
    seed: int = Field(default=0, description="Seed of the table each message goes to.")
    run_id: str | None = Field(
        default=None,
        description="Producer run id (message ids are '<run id>-<n>'); default: the first "
        "part of the Dagster run id, so a retried step resumes instead of duplicating.",
    )


@multi_asset(
    name="produce",
    specs=[
        AssetSpec(
            table,
            group_name=PIPELINE_GROUP,
            kinds={"deltalake", "python"},
            description=f"Producer input table: messages dated in {TABLE_ZONES[table]} "
            "(date: string, message: string).",
            metadata={"zone": TABLE_ZONES[table]},
        )
        for table in INPUT_TABLES
    ],
)
def produce(
    context: AssetExecutionContext, config: ProduceConfig, lake: LakeResource, s3: S3Resource
):
    """Write timestamped messages at a fixed rate into timezone1 (New York) and timezone2
    (Paris)."""
    lk = lake.lake()
    if not lk.is_local and ensure_bucket(s3.get_client(), lk.settings.bucket):
        context.log.info(f"created bucket {lk.settings.bucket}")
    lk.check(write=True)
    cfg = EngineProducerConfig(
        rate=config.rate,
        duration=config.duration_s,
        commit_interval=from_ms(config.commit_interval_ms),
        seed=config.seed,
        run_id=config.run_id or context.run.run_id.split("-")[0],
    )
    context.log.info(
        f"producing {cfg.total} messages at {cfg.rate:g} msg/s to {lk.settings.describe()} "
        f"(run {cfg.run_id})"
    )
    report = Producer(lk, cfg).run(
        on_progress=lambda p: context.log.info(
            f"produced {p['messages']}/{p['total']} messages, {p['lag_s']}s behind schedule"
        )
    )
    for table in INPUT_TABLES:
        dt = lk.open(table)
        yield MaterializeResult(
            asset_key=table,
            metadata={
                "rows_written": report.per_table.get(table, 0),
                "table_rows": table_rows(dt),
                "delta_version": dt.version(),
                "commits_both_tables": report.commits,
                "achieved_rate_msg_s": report.achieved_rate,
                "target_rate_msg_s": report.target_rate,
                "max_lag_s": report.max_lag_s,
                "final_lag_s": report.final_lag_s,
                "elapsed_s": report.elapsed_s,
                "producer_run_id": report.run_id,
                "uri": MetadataValue.path(lk.uri(table)),
            },
        )


class EtlConfig(Config):
    """Run config of the bounded ETL run."""

    commit_interval_ms: float = Field(
        default=DEFAULT_COMMIT_INTERVAL_MS, description="Commit the unified table this often (ms)."
    )
    poll_interval_ms: float = Field(
        default=DEFAULT_POLL_INTERVAL_MS, description="Poll the inputs this often (ms)."
    )
    producers: int = Field(
        default=1, description="Finished producer runs to wait for per table before stopping."
    )


@asset(
    name=UNIFIED_TABLE,
    group_name=PIPELINE_GROUP,
    deps=list(INPUT_TABLES),
    kinds={"deltalake", "pathway"},
    description="Both inputs with `date` parsed to epoch-ms `timestamp` (timestamp: double, "
    "message: string, time: int64, diff: int64), written by the Pathway ETL in its own "
    "process (bounded mode, launched through Dagster Pipes).",
)
def timezone_unified(
    context: AssetExecutionContext,
    config: EtlConfig,
    lake: LakeResource,
    pipes_subprocess_client: PipesSubprocessClient,
    etl_service: EtlServiceResource,
) -> MaterializeResult:
    status = etl_service.service().status()
    if status.alive:
        raise Failure(
            f"the continuous ETL service is running (pid {status.pid}); a bounded ETL run "
            "would write the same table concurrently",
            metadata={"fix": "stop it first with the etl_service_stop_job"},
        )
    lk = lake.lake(check=True)
    command = etl_command(
        "bounded",
        commit_interval=from_ms(config.commit_interval_ms),
        poll_interval=from_ms(config.poll_interval_ms, "poll interval"),
        producers=config.producers,
    )
    context.log.info(f"ETL process on {lk.settings.describe()}: {' '.join(command[1:])}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PIPES_INTERNAL_WARNING)
        invocation = pipes_subprocess_client.run(
            command=command, context=context, env=lake.subprocess_env()
        )
    result = invocation.get_materialize_result()
    dt = lk.open(UNIFIED_TABLE)
    return MaterializeResult(
        metadata={
            **(result.metadata or {}),
            "table_rows": table_rows(dt),
            "uri": MetadataValue.path(lk.uri(UNIFIED_TABLE)),
        }
    )


class ResultsConfig(Config):
    path: str = Field(default="results.csv", description="CSV file to write.")


@asset(
    group_name=PIPELINE_GROUP,
    deps=[UNIFIED_TABLE],
    kinds={"csv", "duckdb"},
    description="timezone_unified exported as CSV (timestamp,message,time,diff), ordered by "
    "time: a changelog, where a row with diff -1 retracts an earlier one (an input deleted or "
    "updated it).",
)
def results_csv(config: ResultsConfig, lake: LakeResource) -> MaterializeResult:
    out = Path(config.path).resolve()
    rows = export_results(lake.lake(), out)
    return MaterializeResult(
        metadata={
            "rows": rows,
            "path": MetadataValue.path(str(out)),
            "bytes": out.stat().st_size,
        }
    )
