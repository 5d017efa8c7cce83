"""Print what the latest run of a job found: latency table, checks, outputs.

    python -m tools.report                  # latest pipeline_job run in $DAGSTER_HOME, and
                                            # the producer_run_job run of its producer run
    python -m tools.report --job producer_run_job

Exits 1 when that run failed or an ERROR-severity check did not pass. Runs are read with
`get_run_records` and materializations with `fetch_materializations`; check evaluations
with `get_records_for_run`, as no `@public` instance method of Dagster 1.13 returns them.
"""

import argparse
import os
import sys
from typing import Any

from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    RunRecord,
    RunsFilter,
)

FOLLOW_UP_JOB = "producer_run_job"
PARTITION_TAG = "dagster/partition"
# The assets whose materializations the report prints.
REPORTED_ASSETS = (
    "timezone1",
    "timezone2",
    "timezone_unified",
    "results_csv",
    "latency_percentiles",
)
# Materializations of one asset read per run: a run writes one (one partition) of each.
MATERIALIZATIONS_READ = 20


def _value(entry: object) -> object:
    return getattr(entry, "value", entry)


def _materializations(instance: DagsterInstance, run: RunRecord) -> dict[str, Any]:
    """The metadata of each reported asset's materialization by `run`, by asset name."""
    out = {}
    since = run.create_timestamp.timestamp()
    for name in REPORTED_ASSETS:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(name), after_timestamp=since),
            limit=MATERIALIZATIONS_READ,
        ).records
        for record in records:
            mat = record.asset_materialization
            if record.run_id == run.dagster_run.run_id and mat is not None:
                out[name] = mat.metadata
                break
    return out


def _latest_run(instance: DagsterInstance, filters: RunsFilter) -> RunRecord | None:
    records = instance.get_run_records(filters=filters, limit=1)
    return records[0] if records else None


def _follow_up(instance: DagsterInstance, producer_run: str | None) -> RunRecord | None:
    """The latest producer_run_job run of `producer_run` (its latency partition)."""
    if producer_run is None:
        return None
    return _latest_run(
        instance, RunsFilter(job_name=FOLLOW_UP_JOB, tags={PARTITION_TAG: producer_run})
    )


def report(job: str, instance: DagsterInstance) -> int:
    record = _latest_run(instance, RunsFilter(job_name=job))
    if record is None:
        print(f"no run of {job} in {os.environ.get('DAGSTER_HOME', 'this instance')}")
        return 1
    run = record.dagster_run
    print(f"{job} run {run.run_id}: {run.status.value}")
    materializations = _materializations(instance, record)
    produced = [
        int(_value(materializations[t]["rows_written"]))  # type: ignore[arg-type]
        for t in ("timezone1", "timezone2")
        if t in materializations
    ]
    unified = materializations.get("timezone_unified")
    producer_run = _value((unified or {}).get("producer_run"))
    follow = (
        _follow_up(instance, producer_run and str(producer_run)) if job != FOLLOW_UP_JOB else None
    )
    runs_read = [run, *([follow.dagster_run] if follow else [])]
    if follow is not None:
        print(
            f"{FOLLOW_UP_JOB} run {follow.dagster_run.run_id} (producer run {producer_run}): "
            f"{follow.dagster_run.status.value}"
        )
        materializations = {**materializations, **_materializations(instance, follow)}
    elapsed = record.end_time - record.start_time if record.start_time and record.end_time else None
    print("\nsummary:")
    if produced:
        print(f"  messages produced   {sum(produced)}")
    if unified and "rows" in unified:
        mode = _value(unified.get("mode", "batch"))
        print(f"  mode                {mode}")
        print(f"  unified rows        {_value(unified['rows'])} written by this run's ETL")
        if "table_rows" in unified:
            print(f"  unified table       {_value(unified['table_rows'])} rows in all")
        print(f"  rejected rows       {_value(unified.get('rejected_rows', 0))}")
    if elapsed is not None:
        print(f"  elapsed             {elapsed:.1f} s ({job})")
    latency = materializations.get("latency_percentiles")
    if latency:
        text = latency.get("percentiles_md") or latency.get("percentiles")
        print("\n" + str(_value(text)))
        plot = latency.get("latency_over_time") or latency.get("plot_path")
        if plot is not None:
            print(f"\nlatency-over-time plot: {_value(plot)}")
    if "results_csv" in materializations:
        csv = materializations["results_csv"]
        print(f"results CSV: {_value(csv['path'])} ({_value(csv['rows'])} rows)")
    # The latest evaluation of each check across the run and its follow-up.
    evaluations: dict[str, Any] = {}
    for r in runs_read:
        connection = instance.get_records_for_run(
            r.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
        )
        for rec in connection.records:
            ev = rec.event_log_entry.dagster_event.event_specific_data  # type: ignore[union-attr]
            evaluations[f"{ev.asset_key.to_user_string()}.{ev.check_name}"] = ev
    if evaluations:
        print("\nchecks:")
    failed = 0
    for name, ev in evaluations.items():
        status = "passed" if ev.passed else f"FAILED ({ev.severity.value})"
        detail = f": {ev.description}" if ev.description else ""
        print(f"  {name}: {status}{detail}")
        if not ev.passed and ev.severity == AssetCheckSeverity.ERROR:
            failed += 1
    ok = all(r.status.value == "SUCCESS" for r in runs_read)
    return 1 if failed or not ok else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="pipeline_job")
    args = parser.parse_args()
    with DagsterInstance.get() as instance:
        sys.exit(report(args.job, instance))


if __name__ == "__main__":
    main()
