"""The pipeline's jobs and the sensor that measures every producer run."""

import json

from dagster import (
    AssetKey,
    AssetPartitionStatus,
    AssetSelection,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    in_process_executor,
    sensor,
)

from assets.common import PRODUCER_RUNS
from assets.latency.assets import LATENCY_ASSET
from assets.service.automation import SERVICE_CHECKS
from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_TABLE
from deltabus.apps.timezones.etl.positions import finished_runs_copied, recorded_finished_runs
from deltabus.apps.timezones.layout import read_layout
from resources.lake import LakeResource

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

# Producer runs a sensor cursor remembers (the newest): older ones are long done.
REMEMBERED_RUNS = 500
# Latency partition states in which a run is measured, or being measured, already.
MEASURED = (AssetPartitionStatus.MATERIALIZED, AssetPartitionStatus.IN_PROGRESS)


@sensor(
    job=producer_run_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description="Once per producer run, when the ETL has written that run's last message "
    "(its position in every input passed the run's finish mark): adds the run to the "
    "producer_runs partitions and requests producer_run_job for it (run key = lake root + "
    "run id). Runs whose latency partition is already materialized or being materialized "
    "(make demo) are not requested again.",
)
def unified_commits_sensor(context: SensorEvaluationContext, lake: LakeResource):
    lk = lake.lake()
    layout = read_layout(lk)
    present = [i for i in range(layout.partitions) if lk.exists(layout.unified_of(i))]
    if not present:
        return SkipReason(f"no table at {lk.uri(layout.unified_tables[0])} yet")
    finished: dict[str, set[str]] = {}
    for i in present:
        table = layout.unified_of(i)
        # The finish marks the ETL's positions passed (app transactions, which log cleanup
        # keeps), and the runs its commits record (inputs written before the marks).
        copied = finished_runs_copied(lk, table, layout.inputs_of(i))
        for source, runs in [*copied.items(), *recorded_finished_runs(lk.open(table)).items()]:
            finished.setdefault(source, set()).update(runs)
    # A run is finished when its last message reached the output from every input table.
    complete = set.intersection(*(finished.get(t, set()) for t in layout.input_tables))
    done = json.loads(context.cursor) if context.cursor else []
    new = sorted(complete - set(done))
    if not new:
        return SkipReason(
            f"no producer run finished since the last request ({len(complete)} finished)"
        )
    status = context.instance.get_status_by_partition(AssetKey(LATENCY_ASSET), new, PRODUCER_RUNS)
    measured = {run for run, state in (status or {}).items() if state in MEASURED}
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
