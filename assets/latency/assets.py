"""Latency percentiles of the unified table (DuckDB), a latency-over-time plot, a p99 check."""

from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    asset_check,
)
from dagster_duckdb import DuckDBResource
from pydantic import Field

from assets.common import OWNERS, PIPELINE_GROUP, PRODUCER_RUNS, markdown_table
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.latency import (
    PERCENTILES,
    distinct_events,
    over_time,
    percentiles,
    unified_samples,
)
from deltabus_bench.plots import latency_over_time
from resources.lake import LakeResource

LATENCY_ASSET = "latency_percentiles"
STAT_NAMES = [*PERCENTILES, "max"]
# (value column, label, what makes one distinct event) of each row of the percentile
# table; see docs/guide/dagster.md. A stage whose rows all share one event (the ETL committed
# once) has one value, not a distribution: its percentiles are left empty.
STAGES = [
    ("latency_ms", "end to end (sent to unified commit)", "message"),
    ("pickup_ms", "sent to ETL (Pathway time)", "processed_ms"),
    ("commit_ms", "ETL to unified commit", "committed_ms"),
]


class LatencyConfig(Config):
    warmup_s: float = Field(
        default=1.0, description="Ignore messages sent in the first seconds of the producer run."
    )
    interval_s: float = Field(default=1.0, description="Bucket width of the over-time plot.")
    plot_dir: str = Field(default="artifacts", description="Where the PNG plot is written.")


def _etl_mode(context: AssetExecutionContext) -> str:
    """How the unified rows were written (streaming, batch, service, etl), from the table's
    newest materialization: batch latency includes the producer's whole run."""
    event = context.instance.get_latest_materialization_event(AssetKey(UNIFIED_TABLE))
    mat = event.asset_materialization if event else None
    entry = mat.metadata.get("mode") if mat else None
    return str(getattr(entry, "value", entry) or "unknown")


def _seconds_key(name: str) -> str:
    """'p99.9' -> 'p99_9_s': a metadata name with its unit."""
    return name.replace(".", "_") + "_s"


@asset(
    name=LATENCY_ASSET,
    group_name=PIPELINE_GROUP,
    deps=[UNIFIED_TABLE],
    kinds={"duckdb", "python"},
    owners=OWNERS,
    partitions_def=PRODUCER_RUNS,
    description="End-to-end latency percentiles (p50 .. p99.9, max; seconds) of one producer "
    "run's rows (the partition key is the producer run id) after the warm-up, by stage, with "
    "a latency-over-time plot.",
)
def latency_percentiles(
    context: AssetExecutionContext, config: LatencyConfig, lake: LakeResource, duck: DuckDBResource
) -> MaterializeResult:
    run = context.partition_key
    lk = lake.lake()
    samples = unified_samples(lk)
    with duck.get_connection() as con:
        con.register("unified_samples_arrow", samples)
        con.execute(
            f"""CREATE OR REPLACE TEMP VIEW samples AS
               SELECT *, processed_ms - sent_ms AS pickup_ms,
                      committed_ms - processed_ms AS commit_ms
               FROM unified_samples_arrow
               WHERE regexp_extract(message, '^(.*)-[0-9]+$', 1) = {_sql_str(run)}"""
        )
        stats = {
            col: {
                **percentiles(con, "samples", config.warmup_s, value=col),
                "events": distinct_events(con, "samples", config.warmup_s, event),
            }
            for col, _, event in STAGES
        }
        curve = over_time(con, "samples", config.interval_s)
    e2e = stats["latency_ms"]
    if not e2e["samples"]:
        raise Failure(
            f"no latency samples after the first {config.warmup_s:g}s of producer run {run}",
            metadata={"fix": "lower warmup_s, or produce for longer"},
        )
    mode = _etl_mode(context)
    table = [
        {
            "mode": mode,
            "stage": label,
            "samples": stats[col]["samples"],
            "events": stats[col]["events"],
            **{n: _stat(stats[col], n) for n in STAT_NAMES},
        }
        for col, label, _ in STAGES
    ]
    scope = f"producer run {run}"
    plot_path = latency_over_time(
        Path(config.plot_dir).resolve() / f"latency_over_time-{_file_safe(run)}.png",
        f"{UNIFIED_TABLE} latency over time ({scope})",
        curve,
        config.warmup_s,
    )
    context.log.info("latency (s):\n" + markdown_table(table))
    return MaterializeResult(
        metadata={
            # Inline in the UI, first: one row per stage, seconds.
            "percentiles": MetadataValue.table(
                records=[
                    TableRecord(
                        {
                            "mode": row["mode"],
                            "stage": row["stage"],
                            "samples": int(row["samples"]),
                            "events": int(row["events"]),
                            **{_seconds_key(n): _round(row[n]) for n in STAT_NAMES},
                        }
                    )
                    for row in table
                ],
                schema=TableSchema(
                    columns=[
                        TableColumn("mode", "string"),
                        TableColumn("stage", "string"),
                        TableColumn("samples", "int"),
                        TableColumn(
                            "events",
                            "int",
                            description="distinct messages, ETL batches or commits behind "
                            "the stage's values; with 1 the stage has one value (max_s)",
                        ),
                        *(TableColumn(_seconds_key(n), "float") for n in STAT_NAMES),
                    ]
                ),
            ),
            "samples": int(e2e["samples"]),
            **{_seconds_key(n): round(float(e2e[n]), 4) for n in STAT_NAMES},
            "percentiles_md": MetadataValue.md(
                f"Latency in seconds after a {config.warmup_s:g} s warm-up ({scope}, "
                f"{mode}).\n\n"
                + markdown_table(table, ["mode", "stage", "samples", "events", *STAT_NAMES])
            ),
            "latency_over_time": MetadataValue.path(str(plot_path)),
            "scope": scope,
            "mode": mode,
            "warmup_s": config.warmup_s,
        }
    )


def _stat(stats: dict[str, Any], name: str) -> float | None:
    """A percentile, or None where the stage had a single event (one value, shown as max)."""
    if name != "max" and stats["events"] < 2:
        return None
    return float(stats[name])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _sql_str(value: Any) -> str:
    return "'" + str(value).replace("'", "''") + "'"


class LatencyLimitConfig(Config):
    p99_limit_s: float = Field(
        default=30.0,
        description="Fail when the latest p99 end-to-end latency exceeds this many seconds. "
        "Streaming (pipeline_job's default, or the continuous service) stays within ~2 s; "
        "batch mode's latency includes the whole producer run.",
    )


@asset_check(
    asset=LATENCY_ASSET,
    name="p99_within_limit",
    description="The latest materialization's p99 latency is within the configured limit.",
)
def p99_within_limit(
    context: AssetCheckExecutionContext, config: LatencyLimitConfig
) -> AssetCheckResult:
    event = context.instance.get_latest_materialization_event(AssetKey(LATENCY_ASSET))
    mat = event.asset_materialization if event else None
    if mat is None or "p99_s" not in mat.metadata:
        return AssetCheckResult(
            passed=False, metadata={"problem": f"{LATENCY_ASSET} has no p99 yet: materialize it"}
        )
    p99 = float(mat.metadata["p99_s"].value)  # type: ignore[arg-type]
    passed = p99 <= config.p99_limit_s
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        description=None
        if passed
        else f"p99 latency {p99:.3f}s exceeds the limit of {config.p99_limit_s:g}s",
        metadata={
            "p99_s": p99,
            "limit_s": config.p99_limit_s,
            "samples": int(mat.metadata["samples"].value) if "samples" in mat.metadata else 0,  # type: ignore[arg-type]
        },
    )
