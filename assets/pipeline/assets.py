"""The lake's tables as assets: producer inputs, the Pathway ETL's output, the CSV export."""

import subprocess
import tempfile
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetSpec,
    Config,
    Failure,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    asset,
    multi_asset,
    open_pipes_session,
)
from dagster_aws.s3 import S3Resource
from pydantic import Field

from assets.common import (
    MEASURED_POOL,
    OWNERS,
    PIPELINE_GROUP,
    PRODUCER_RUNS,
    column_schema,
    table_rows,
)
from assets.pipeline.checks import preload_great_expectations
from deltabus.apps.timezones.contracts import (
    INPUT_SCHEMA,
    INPUT_TABLES,
    TABLE_ZONES,
    UNIFIED_SCHEMA,
    UNIFIED_TABLE,
)
from deltabus.apps.timezones.etl.command import etl_command
from deltabus.apps.timezones.layout import read_layout
from deltabus.apps.timezones.producer import ProducerConfig as EngineProducerConfig
from deltabus.apps.timezones.producer import ProducerReport, TimezoneProducer
from deltabus.apps.timezones.results import export_results
from deltabus.core.intervals import DEFAULT_COMMIT_INTERVAL_MS, DEFAULT_POLL_INTERVAL_MS, from_ms
from deltabus.core.paths import REPO_ROOT
from deltabus.core.processes import wait_for_file
from deltabus.delta.lake import Lake
from resources.etl import PIPES_INTERNAL_WARNING, EtlServiceResource
from resources.lake import LakeResource
from resources.s3 import ensure_bucket

MODES = ("streaming", "batch")


class StreamConfig(Config):
    """Run config of the stream window (small defaults: a demo, not a benchmark)."""

    mode: str = Field(
        default="streaming",
        description="streaming: the ETL starts first and transforms each commit as the "
        "producer writes it (latency in tenths of a second); batch: the producer writes "
        "everything, then the ETL runs (latency = the producer's whole run).",
    )
    rate: float = Field(default=2000, description="Messages per second (open-loop schedule).")
    duration_s: float = Field(default=5.0, description="Seconds to produce for.")
    commit_interval_ms: float = Field(
        default=DEFAULT_COMMIT_INTERVAL_MS,
        description="One commit per input table per interval (ms); the ETL commits "
        "timezone_unified as often.",
    )
    poll_interval_ms: float = Field(
        default=DEFAULT_POLL_INTERVAL_MS, description="The ETL's shortest poll interval (ms)."
    )
    seed: int = Field(default=0, description="Seed of the table each message goes to.")
    run_id: str | None = Field(
        default=None,
        description="Producer run id (message ids are '<run id>-<n>'); default: the first "
        "part of the Dagster run id, so a retried step resumes instead of duplicating.",
    )
    producers: int = Field(
        default=1,
        description="ETL alone (only timezone_unified selected): finished producer runs to "
        "wait for per table before stopping.",
    )


@multi_asset(
    name="stream_window",
    can_subset=True,
    # One latency-measured step at a time across runs (platform/dagster.yaml).
    pool=MEASURED_POOL,
    specs=[
        *(
            AssetSpec(
                table,
                group_name=PIPELINE_GROUP,
                kinds={"deltalake", "python"},
                description=f"Producer input table: messages dated in {TABLE_ZONES[table]} "
                "(date: string, message: string).",
                metadata={
                    "zone": TABLE_ZONES[table],
                    "dagster/column_schema": column_schema(
                        INPUT_SCHEMA,
                        {"date": f"local time in {TABLE_ZONES[table]}", "message": "message id"},
                    ),
                },
                owners=OWNERS,
                skippable=True,
            )
            for table in INPUT_TABLES
        ),
        AssetSpec(
            UNIFIED_TABLE,
            group_name=PIPELINE_GROUP,
            deps=list(INPUT_TABLES),
            kinds={"deltalake", "pathway"},
            description="Both inputs with `date` parsed to epoch-ms `timestamp` (timestamp: "
            "double, message: string, time: int64, diff: int64), written by the Pathway ETL "
            "in its own process (launched through Dagster Pipes). The continuous ETL "
            "service's commits are recorded as materializations by the etl_service_sensor.",
            metadata={
                "dagster/column_schema": column_schema(
                    UNIFIED_SCHEMA,
                    {
                        "timestamp": "epoch milliseconds (UTC) of the input's date",
                        "time": "Pathway processing time (ms)",
                        "diff": "+1 insertion, -1 retraction",
                    },
                )
            },
            owners=OWNERS,
            skippable=True,
            # Stale when neither a stream window nor the service wrote it for a while.
            freshness_policy=FreshnessPolicy.time_window(
                fail_window=timedelta(hours=24), warn_window=timedelta(minutes=15)
            ),
        ),
    ],
)
def stream_window(
    context: AssetExecutionContext,
    config: StreamConfig,
    lake: LakeResource,
    s3: S3Resource,
    etl_service: EtlServiceResource,
):
    """One stream window: the Pathway ETL tails timezone1 and timezone2 while the producer
    writes them, and stops once it has written the producer's last message.

    Selected alone, the inputs are produced without an ETL, and timezone_unified runs the
    ETL over what the inputs hold (until `producers` runs have finished)."""
    if config.mode not in MODES:
        raise Failure(f"mode must be one of {', '.join(MODES)}, got {config.mode!r}")
    selected = {key.to_user_string() for key in context.selected_asset_keys}
    produce = bool(selected & set(INPUT_TABLES))
    transform = UNIFIED_TABLE in selected
    lk = lake.lake()
    if not lk.is_local and ensure_bucket(s3.get_client(), lk.settings.bucket):
        context.log.info(f"created bucket {lk.settings.bucket}")
    lk.check(write=True)
    if transform:
        _refuse_beside_the_service(etl_service)
        # The checks that follow need Great Expectations: import it while the ETL starts.
        preload_great_expectations()
    producer = _producer_config(context, config)
    mode = config.mode if produce and transform else ("produce" if produce else "etl")
    etl_results: list[MaterializeResult] = []
    report = None
    if not transform:
        report = _produce(context, lk, producer)
    elif not produce:
        etl_results = _run_etl(context, lake, config, config.producers, None)
    elif config.mode == "batch":
        report = _produce(context, lk, producer)
        etl_results = _run_etl(context, lake, config, 1, None, until_run=producer.run_id)
    else:  # streaming: the ETL's dataflow is up before the first message is sent
        reports: list[ProducerReport] = []
        etl_results = _run_etl(
            context,
            lake,
            config,
            1,
            lambda: reports.append(_produce(context, lk, producer)),
            # Earlier runs' finish markers are in the inputs' history: wait for this one.
            until_run=producer.run_id,
        )
        report = reports[0]
    if produce:
        assert report is not None
        # The run's latency and checks are partitions keyed by the producer run id.
        context.instance.add_dynamic_partitions(PRODUCER_RUNS.name or "", [report.run_id])
        for table in INPUT_TABLES:
            if table in selected:
                yield _input_result(lk, table, report)
    if transform:
        tables = _present(lk, UNIFIED_TABLE)
        rows = sum(table_rows(lk.open(t)) for t in tables)
        metadata = dict(etl_results[0].metadata or {}) if etl_results else {}
        yield MaterializeResult(
            asset_key=UNIFIED_TABLE,
            metadata={
                **metadata,
                "mode": mode,
                **({"producer_run": report.run_id} if report else {}),
                "partitions": read_layout(lk).partitions,
                "table_rows": rows,
                "dagster/row_count": rows,
                "delta_version": sum(lk.open(t).version() for t in tables),
                "uri": MetadataValue.path(lk.uri(tables[0])),
            },
        )


def _present(lk: Lake, stream: str) -> list[str]:
    """The stream's table, or its partition tables (deltabus.apps.timezones.layout)."""
    tables = [t for t in read_layout(lk).inputs(stream) if lk.exists(t)]
    return tables or [stream]


def _refuse_beside_the_service(etl_service: EtlServiceResource) -> None:
    status = etl_service.service().status()
    if status.alive:
        raise Failure(
            f"the continuous ETL service is running (pid {status.pid}); a bounded ETL run "
            "would write the same table concurrently",
            metadata={"fix": "stop it first with the etl_service_stop_job"},
        )


def _producer_config(context: AssetExecutionContext, config: StreamConfig) -> EngineProducerConfig:
    return EngineProducerConfig(
        rate=config.rate,
        duration=config.duration_s,
        commit_interval=from_ms(config.commit_interval_ms),
        seed=config.seed,
        run_id=config.run_id or context.run.run_id.split("-")[0],
    )


def _produce(context: AssetExecutionContext, lk: Lake, cfg: EngineProducerConfig) -> ProducerReport:
    context.log.info(
        f"producing {cfg.total} messages at {cfg.rate:g} msg/s to {lk.settings.describe()} "
        f"(run {cfg.run_id})"
    )
    report = TimezoneProducer(lk, cfg).run(
        on_progress=lambda p: context.log.info(
            f"produced {p['messages']}/{p['total']} messages, {p['lag_s']}s behind schedule"
        )
    )
    return report


def _input_result(lk: Lake, table: str, report: ProducerReport) -> MaterializeResult:
    parts = [lk.open(t) for t in _present(lk, table)]
    rows = sum(table_rows(dt) for dt in parts)
    return MaterializeResult(
        asset_key=table,
        metadata={
            "rows_written": report.per_stream.get(table, 0),
            "partitions": report.partitions,
            "table_rows": rows,
            "dagster/row_count": rows,
            # The table's version; with partitions, the sum of theirs.
            "delta_version": sum(dt.version() for dt in parts),
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


def _run_etl(
    context: AssetExecutionContext,
    lake: LakeResource,
    config: StreamConfig,
    producers: int,
    meanwhile: Callable[[], object] | None,
    until_run: str | None = None,
) -> list[MaterializeResult]:
    """The bounded ETL as its own process through Dagster Pipes; with `meanwhile`, that
    runs once the ETL's dataflow is up (the producer, in streaming mode)."""
    with tempfile.TemporaryDirectory(prefix="deltabus-etl-") as tmp:
        ready = Path(tmp) / "ready"
        command = etl_command(
            "bounded",
            commit_interval=from_ms(config.commit_interval_ms),
            poll_interval=from_ms(config.poll_interval_ms, "poll interval"),
            producers=producers,
            until_run=until_run,
            ready_file=ready,
        )
        context.log.info(f"ETL process: {' '.join(command[1:])}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=PIPES_INTERNAL_WARNING)
            with open_pipes_session(
                context=context,
                context_injector=PipesTempFileContextInjector(),
                message_reader=PipesTempFileMessageReader(),
            ) as session:
                env = {**lake.subprocess_env(), **session.get_bootstrap_env_vars()}
                etl = subprocess.Popen(command, env=env, cwd=REPO_ROOT)
                try:
                    if meanwhile is not None:
                        wait_for_file(
                            ready,
                            lambda: etl.poll() is None,
                            what="the ETL",
                            timeout=120,
                            hint="see the step's stderr",
                        )
                        context.log.info("ETL dataflow running; producing")
                        meanwhile()
                    code = etl.wait()
                finally:
                    if etl.poll() is None:
                        etl.terminate()
                        etl.wait(60)
                if code != 0:
                    raise Failure(f"the ETL process exited with status {code}; see its log above")
            return list(session.get_results())


class ResultsConfig(Config):
    path: str = Field(default="results.csv", description="CSV file to write.")


@asset(
    group_name=PIPELINE_GROUP,
    deps=[UNIFIED_TABLE],
    kinds={"csv", "duckdb"},
    owners=OWNERS,
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
            "dagster/row_count": rows,
            "path": MetadataValue.path(str(out)),
            "bytes": out.stat().st_size,
        }
    )
