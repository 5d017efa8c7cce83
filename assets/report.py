"""Print what the latest run of a job found: latency table, checks, outputs.

    python -m assets.report                 # latest pipeline_job run in $DAGSTER_HOME
    python -m assets.report --job unified_checks_job

Exits 1 when that run failed or an ERROR-severity check did not pass.
"""

import argparse
import os
import sys

from dagster import AssetCheckSeverity, DagsterEventType, DagsterInstance, RunsFilter


def _value(entry: object) -> object:
    return getattr(entry, "value", entry)


def report(job: str, instance: DagsterInstance) -> int:
    runs = instance.get_runs(filters=RunsFilter(job_name=job), limit=1)
    if not runs:
        print(f"no run of {job} in {os.environ.get('DAGSTER_HOME', 'this instance')}")
        return 1
    run = runs[0]
    print(f"{job} run {run.run_id}: {run.status.value}")
    materializations = {}
    for record in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        mat = record.dagster_event.event_specific_data.materialization  # type: ignore[union-attr]
        materializations[mat.asset_key.to_user_string()] = mat.metadata
    produced = [
        int(_value(materializations[t]["rows_written"]))  # type: ignore[arg-type]
        for t in ("timezone1", "timezone2")
        if t in materializations
    ]
    unified = materializations.get("timezone_unified")
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
        print(f"  elapsed             {elapsed:.1f} s (whole run)")
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
    failed = 0
    evaluations = instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    if evaluations:
        print("\nchecks:")
    for record in evaluations:
        ev = record.dagster_event.event_specific_data  # type: ignore[union-attr]
        status = "passed" if ev.passed else f"FAILED ({ev.severity.value})"
        detail = f": {ev.description}" if ev.description else ""
        print(f"  {ev.asset_key.to_user_string()}.{ev.check_name}: {status}{detail}")
        if not ev.passed and ev.severity == AssetCheckSeverity.ERROR:
            failed += 1
    return 1 if failed or run.status.value != "SUCCESS" else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="pipeline_job")
    args = parser.parse_args()
    with DagsterInstance.get() as instance:
        sys.exit(report(args.job, instance))


if __name__ == "__main__":
    main()
