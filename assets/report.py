"""Print what the latest run of a job found: latency table, checks, outputs.

    python -m assets.report                 # latest pipeline_job run in $DAGSTER_HOME, and
                                            # the producer_run_job run of its producer run
    python -m assets.report --job producer_run_job

Exits 1 when that run failed or an ERROR-severity check did not pass.
"""

import argparse
import os
import sys
from typing import Any

from dagster import AssetCheckSeverity, DagsterEventType, DagsterInstance, DagsterRun, RunsFilter

FOLLOW_UP_JOB = "producer_run_job"
PARTITION_TAG = "dagster/partition"


def _value(entry: object) -> object:
    return getattr(entry, "value", entry)


def _materializations(instance: DagsterInstance, run_id: str) -> dict[str, Any]:
    out = {}
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        mat = record.dagster_event.event_specific_data.materialization  # type: ignore[union-attr]
        out[mat.asset_key.to_user_string()] = mat.metadata
    return out


def _follow_up(instance: DagsterInstance, producer_run: str | None) -> DagsterRun | None:
    """The latest producer_run_job run of `producer_run` (its latency partition)."""
    if producer_run is None:
        return None
    runs = instance.get_runs(
        filters=RunsFilter(job_name=FOLLOW_UP_JOB, tags={PARTITION_TAG: producer_run}), limit=1
    )
    return runs[0] if runs else None


def report(job: str, instance: DagsterInstance) -> int:
    runs = instance.get_runs(filters=RunsFilter(job_name=job), limit=1)
    if not runs:
        print(f"no run of {job} in {os.environ.get('DAGSTER_HOME', 'this instance')}")
        return 1
    run = runs[0]
    print(f"{job} run {run.run_id}: {run.status.value}")
    materializations = _materializations(instance, run.run_id)
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
    runs_read = [run, *([follow] if follow else [])]
    if follow is not None:
        print(
            f"{FOLLOW_UP_JOB} run {follow.run_id} (producer run {producer_run}): "
            f"{follow.status.value}"
        )
        materializations = {**materializations, **_materializations(instance, follow.run_id)}
    record = instance.get_run_record_by_id(run.run_id)
    elapsed = (
        record.end_time - record.start_time
        if record and record.start_time and record.end_time
        else None
    )
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
        for rec in instance.all_logs(r.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
            ev = rec.dagster_event.event_specific_data  # type: ignore[union-attr]
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
