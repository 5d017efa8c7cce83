"""Sensors against real Delta tables on MinIO, and the continuous ETL service they watch."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetMaterialization,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_sensor_context,
    materialize,
)
from deltalake import CommitProperties, Transaction, write_deltalake

from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_SCHEMA, UNIFIED_TABLE
from deltabus.apps.timezones.etl.positions import ETL_APP_ID, position_marker
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.apps.timezones.service import EtlService, lag, process_alive
from deltabus.delta.lake import Lake
from deltabus.delta.tables import ensure_table, metadata
from tests.conftest import lake_env, use_lake_env
from tests.helpers import assert_exactly_once, etl_process, read_unified, wait_for_file


@pytest.fixture
def env(minio_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Point the resources (which read the environment) at a fresh MinIO prefix."""
    use_lake_env(monkeypatch, minio_lake)
    monkeypatch.setenv("DELTABUS_SERVICE_DIR", str(tmp_path / "service"))
    return {"lake": minio_lake, "tmp": tmp_path}


def produce(lake: Lake, count: int, run_id: str, rate: float = 5000) -> None:
    report = TimezoneProducer(
        lake, ProducerConfig(rate=rate, count=count, commit_interval=0.1, run_id=run_id)
    ).run()
    assert report.messages == count


def unified_commit(
    lake: Lake,
    messages: list[str],
    positions: dict[str, int],
    finished: dict[str, list[str]] | None = None,
) -> None:
    """A commit shaped like the ETL's: rows plus the input positions it covers, and the
    producer runs it saw finish per input (`finished`), as the ETL's sink records them."""
    dt = ensure_table(lake, UNIFIED_TABLE, UNIFIED_SCHEMA)
    rows = pa.table(
        {
            "timestamp": [1.0e12] * len(messages),
            "message": messages,
            "time": [1] * len(messages),
            "diff": [1] * len(messages),
        },
        schema=UNIFIED_SCHEMA,
    )
    write_deltalake(
        dt,
        rows,
        mode="append",
        commit_properties=CommitProperties(
            custom_metadata=metadata(
                **{"etl.positions": positions, "etl.seq": 0},
                **({"etl.finished_runs": finished} if finished is not None else {}),
            ),
            # As the ETL's sink commits: the positions are app transactions.
            app_transactions=[
                Transaction(ETL_APP_ID, 0),
                *(Transaction(position_marker(t), v) for t, v in positions.items()),
            ],
        ),
    )


def resources() -> dict:
    from resources import default_resources

    return default_resources()


def test_unified_commits_sensor_requests_once_per_finished_producer_run(env):
    from assets.pipeline.automation import producer_run_job, unified_commits_sensor

    lake: Lake = env["lake"]
    instance = DagsterInstance.ephemeral()

    def evaluate(cursor: str | None = None):
        context = build_sensor_context(instance=instance, cursor=cursor, resources=resources())
        return unified_commits_sensor(context)

    assert unified_commits_sensor.job_name == producer_run_job.name
    first = evaluate()
    assert isinstance(first, SkipReason) and "no table" in first.skip_message

    # Run a's last message reached one table only: not finished yet.
    unified_commit(lake, ["a-0", "a-1"], {}, {"timezone1": ["a"], "timezone2": []})
    waiting = evaluate()
    assert isinstance(waiting, SkipReason)

    unified_commit(lake, ["a-2"], {}, {"timezone1": ["a"], "timezone2": ["a"]})
    result = evaluate()
    assert isinstance(result, SensorResult)
    (request,) = result.run_requests
    assert request.run_key == f"{lake.root}:a" and request.partition_key == "a"
    assert request.tags["deltabus/producer_run"] == "a"
    (added,) = result.dynamic_partitions_requests
    assert added.partitions_def_name == "producer_runs" and list(added.partition_keys) == ["a"]

    # More commits of the same finished run, and of a run still going: no new request.
    unified_commit(lake, ["b-0"], {}, {"timezone1": ["a", "b"], "timezone2": ["a"]})
    unified_commit(lake, ["b-1"], {}, {"timezone1": ["a", "b"], "timezone2": ["a"]})
    again = evaluate(result.cursor)
    assert isinstance(again, SkipReason)

    # Run b finished; run c finished too, but its latency partition is already there
    # (make demo measured it): b is requested, c is only recorded as a partition.
    instance.add_dynamic_partitions("producer_runs", ["c"])
    instance.report_runless_asset_event(AssetMaterialization("latency_percentiles", partition="c"))
    unified_commit(
        lake, ["b-2", "c-0"], {}, {"timezone1": ["a", "b", "c"], "timezone2": ["a", "b", "c"]}
    )
    newer = evaluate(result.cursor)
    assert isinstance(newer, SensorResult)
    assert [(r.run_key, r.partition_key) for r in newer.run_requests] == [(f"{lake.root}:b", "b")]
    (added,) = newer.dynamic_partitions_requests
    assert list(added.partition_keys) == ["b"]
    assert isinstance(evaluate(newer.cursor), SkipReason)


def test_lag_counts_data_commits_after_the_recorded_positions(env):
    lake: Lake = env["lake"]
    produce(lake, 1000, "lagrun")
    latest = {t: lake.open(t).version() for t in INPUT_TABLES}
    before = lag(lake)
    assert before["unified_version"] is None
    assert all(t["processed_version"] == -1 for t in before["tables"].values())
    assert before["data_commits_behind"] > 0 and before["max_lag_s"] >= 0

    unified_commit(lake, ["x-0"], {"timezone1": latest["timezone1"], "timezone2": 0})
    lake.open("timezone1").optimize.compact()  # a commit without new rows
    lake.open("timezone2").optimize.compact()
    after = lag(lake, now=time.time() + 10)
    done = after["tables"]["timezone1"]
    assert done["versions_behind"] == 1 and done["data_commits_behind"] == 0
    assert done["lag_s"] == 0.0
    behind = after["tables"]["timezone2"]
    assert behind["versions_behind"] == latest["timezone2"] + 1  # appends 1.. and the compaction
    assert behind["data_commits_behind"] == latest["timezone2"]
    assert behind["lag_s"] >= 10
    assert after["max_lag_s"] == behind["lag_s"]


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def caught_up(lake: Lake, rows: int) -> bool:
    from deltabus.apps.timezones.layout import read_layout

    tables = read_layout(lake).unified_tables  # the table, or its partitions
    return any(lake.exists(t) for t in tables) and read_unified(lake).height >= rows


def test_service_is_started_watched_relaunched_and_stopped(env):
    from assets.service.automation import etl_service_sensor
    from definitions import build_definitions

    lake: Lake = env["lake"]
    service = EtlService(env["tmp"] / "service")
    defs = build_definitions(resources())
    instance = DagsterInstance.ephemeral()

    def sensor_events() -> dict:
        result = etl_service_sensor(build_sensor_context(resources=resources()))
        assert isinstance(result, SensorResult), result
        (mat,) = [e for e in result.asset_events if isinstance(e, AssetMaterialization)]
        checks = {e.check_name: e.passed for e in result.asset_events if e not in (mat,)}
        assert set(checks) == {"etl_service_alive", "etl_lag_within_limit"}
        return {**{k: v.value for k, v in mat.metadata.items()}, "_checks": checks, "_r": result}

    produce(lake, 1000, "svc1")
    try:
        start = defs.resolve_job_def("etl_service_start_job").execute_in_process(instance=instance)
        assert start.success
        status = service.status()
        assert status.alive and status.enabled and status.pid
        assert str(lake.settings.secret_key.get_secret_value()) not in " ".join(status.command)
        wait_until(lambda: caught_up(lake, 1000), 60, "the service to process 1000 rows")
        wait_until(lambda: lag(lake)["data_commits_behind"] == 0, 30, "positions to catch up")
        from assets.pipeline.assets import stream_window

        clash = materialize(
            [stream_window],
            selection=[UNIFIED_TABLE],
            resources=resources(),
            instance=instance,
            raise_on_error=False,
        )
        assert not clash.success  # a bounded ETL next to the running service is refused
        (failure,) = [e for e in clash.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "continuous ETL service is running" in str(failure.step_failure_data.error)

        seen = sensor_events()
        assert seen["service_alive"] and not seen["service_restarted"]
        assert seen["data_commits_behind"] == 0 and seen["max_lag_s"] == 0.0
        assert seen["dagster/row_count"] == 1000 and seen["mode"] == "service"
        assert seen["_checks"] == {"etl_service_alive": True, "etl_lag_within_limit": True}
        # Nothing changed since: no event at all (the table stays as it was in the UI).
        quiet = etl_service_sensor(
            build_sensor_context(cursor=seen["_r"].cursor, resources=resources())
        )
        assert isinstance(quiet, SkipReason)

        os.kill(status.pid, signal.SIGKILL)  # the service dies
        wait_until(lambda: not process_alive(status.pid), 10, "the killed service to be gone")
        relaunch = sensor_events()
        assert relaunch["service_restarted"] and relaunch["service_restarts"] == 1
        assert service.status().alive and service.status().pid != status.pid

        produce(lake, 1000, "svc2")
        wait_until(lambda: caught_up(lake, 2000), 60, "the relaunched service to catch up")
        assert_exactly_once(lake, expected=2000)  # it resumed where the commits ended

        # A second ETL started by hand fences the service; the sensor must not relaunch
        # the service while that one runs (they would fence each other in turn).
        relaunched = service.status().pid
        ready = env["tmp"] / "manual-ready"
        manual = etl_process(
            lake_env(lake), env["tmp"], "--mode", "continuous", "--ready-file", str(ready)
        )
        try:
            wait_for_file(ready, manual)
            wait_until(lambda: not process_alive(relaunched), 30, "the fenced service to exit")
            held = sensor_events()
            assert (
                not held["service_restarted"] and f"pid {manual.pid}" in held["held_by_other_etl"]
            )
            assert not service.status().alive
        finally:
            manual.terminate()
            manual.communicate(timeout=30)
        back = sensor_events()  # the other ETL is gone: the service comes back
        assert back["service_restarted"] and service.status().alive
        produce(lake, 500, "svc3")
        wait_until(lambda: caught_up(lake, 2500), 60, "the service to take over again")
        assert_exactly_once(lake, expected=2500)

        stop = defs.resolve_job_def("etl_service_stop_job").execute_in_process(instance=instance)
        assert stop.success
        assert not service.status().alive and not service.status().enabled
        idle = sensor_events()
        assert not idle["service_alive"] and not idle["service_restarted"]  # stopped on purpose
        assert "starting ETL service" in service.log_tail(200)
    finally:
        service.stop(timeout=10)


def test_one_check_and_latency_run_per_producer_run_beside_the_service(env):
    """The continuous service transforms two producer runs while the unified_commits_sensor
    is evaluated every half second: exactly one producer_run_job request per run, each for
    its own partition, and those runs pass and measure that run's latency."""
    import threading

    from assets.pipeline.automation import unified_commits_sensor
    from definitions import build_definitions

    lake: Lake = env["lake"]
    service = EtlService(env["tmp"] / "service")
    defs = build_definitions(resources())
    instance = DagsterInstance.ephemeral()
    requests: list = []
    cursor: str | None = None

    def evaluate() -> None:
        nonlocal cursor
        context = build_sensor_context(instance=instance, cursor=cursor, resources=resources())
        result = unified_commits_sensor(context)
        if isinstance(result, SensorResult):
            for added in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(added.partitions_def_name, added.partition_keys)
            requests.extend(result.run_requests)
            cursor = result.cursor

    try:
        start = defs.resolve_job_def("etl_service_start_job").execute_in_process(instance=instance)
        assert start.success
        for run in ("live1", "live2"):
            producing = threading.Thread(target=produce, args=(lake, 2000, run, 1000))
            producing.start()
            while producing.is_alive():  # many evaluations while the run is being written
                evaluate()
                time.sleep(0.5)
            producing.join()
            deadline = time.monotonic() + 60
            while run not in [r.partition_key for r in requests]:
                assert time.monotonic() < deadline, f"no request for {run}: {requests}"
                evaluate()
                time.sleep(0.5)
        for _ in range(3):
            evaluate()
        assert [(r.run_key, r.partition_key) for r in requests] == [
            (f"{lake.root}:live1", "live1"),
            (f"{lake.root}:live2", "live2"),
        ]
        assert set(instance.get_dynamic_partitions("producer_runs")) == {"live1", "live2"}
        job = defs.resolve_job_def("producer_run_job")
        for request in requests:
            result = job.execute_in_process(
                instance=instance,
                partition_key=request.partition_key,
                run_config={"ops": {"latency_percentiles": {"config": {"warmup_s": 0.5}}}},
                tags=request.tags,
            )
            assert result.success
            (mat,) = [
                e.event_specific_data.materialization
                for e in result.get_asset_materialization_events()
            ]
            assert mat.partition == request.partition_key
            assert mat.metadata["scope"].value == f"producer run {request.partition_key}"
            assert 0 < mat.metadata["p50_s"].value < 2.0  # streaming, beside the service
        assert_exactly_once(lake, expected=4000)
    finally:
        service.stop(timeout=10)


def test_a_service_of_two_processes_on_four_partitions(env):
    """etl_service_start_job with processes=2 on a lake of 4 partitions per stream: the
    sensor reports the partition count and the lag per input partition, and relaunches
    only the process that died; the output is exactly-once."""
    from assets.service.automation import etl_service_sensor
    from definitions import build_definitions
    from deltabus.apps.timezones.layout import ensure_layout
    from deltabus.apps.timezones.service import EtlServiceGroup
    from resources.etl import EtlServiceResource

    lake: Lake = env["lake"]
    ensure_layout(lake, 4)
    two = {**resources(), "etl_service": EtlServiceResource(processes=2)}
    defs = build_definitions(two)
    instance = DagsterInstance.ephemeral()
    group = EtlServiceGroup(env["tmp"] / "service", 2)

    def observe() -> dict:
        result = etl_service_sensor(build_sensor_context(resources=two))
        assert isinstance(result, SensorResult), result
        (mat,) = [e for e in result.asset_events if isinstance(e, AssetMaterialization)]
        return {k: v.value for k, v in mat.metadata.items()}

    try:
        start = defs.resolve_job_def("etl_service_start_job").execute_in_process(instance=instance)
        assert start.success
        first = group.status()
        assert first.alive and len(first.pids) == 2 and len(set(first.pids)) == 2
        produce(lake, 2000, "grp1")
        wait_until(lambda: caught_up(lake, 2000), 60, "both processes to write 2000 rows")
        wait_until(lambda: lag(lake)["data_commits_behind"] == 0, 30, "positions to catch up")
        seen = observe()
        assert seen["partitions"] == 4 and seen["etl_processes"] == 2
        assert seen["dagster/row_count"] == 2000 and seen["service_alive"]
        for stream in ("timezone1", "timezone2"):
            for i in range(4):
                assert seen[f"{stream}-p{i}_lag_s"] == 0.0
                assert seen[f"{stream}-p{i}_position"] >= 0

        os.kill(first.pids[1], signal.SIGKILL)  # one of the two dies
        wait_until(lambda: not process_alive(first.pids[1]), 10, "the killed process to go")
        relaunch = observe()
        assert relaunch["service_restarted"]
        after = group.status()
        assert after.alive and after.pids[0] == first.pids[0] and after.pids[1] != first.pids[1]
        produce(lake, 1000, "grp2")
        wait_until(lambda: caught_up(lake, 3000), 60, "the relaunched process to catch up")
        assert_exactly_once(lake, expected=3000)
    finally:
        group.stop(timeout=10)


def test_unified_commits_sensor_reads_finish_marks_after_log_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A run counts as finished from its finish mark in the inputs and the ETL's positions,
    both app transactions: no commit metadata is needed, and log cleanup removes none."""
    from assets.pipeline.automation import unified_commits_sensor
    from deltabus.core.settings import Settings

    lake = Lake(Settings(storage="local", local_root=tmp_path / "lake", prefix="p"))
    use_lake_env(monkeypatch, lake)
    instance = DagsterInstance.ephemeral()

    def evaluate():
        return unified_commits_sensor(
            build_sensor_context(instance=instance, resources=resources())
        )

    produce(lake, 2000, "m")
    marked = {t: lake.latest_version(t) for t in INPUT_TABLES}  # the run's last commit
    # The ETL copied every version but the one holding the run's finish mark: not finished.
    unified_commit(lake, ["m-0"], {t: v - 1 for t, v in marked.items()})
    assert isinstance(evaluate(), SkipReason)

    # Log cleanup of every table: the inputs' commit metadata (`producer.finished`) is gone.
    for table in (*INPUT_TABLES, UNIFIED_TABLE):
        dt = lake.open(table)
        dt.alter.set_table_properties({"delta.logRetentionDuration": "interval 1 seconds"})
    time.sleep(2)
    for table in (*INPUT_TABLES, UNIFIED_TABLE):
        dt = lake.open(table)
        dt.create_checkpoint()
        dt.cleanup_metadata()
        assert not (Path(lake.uri(table)) / "_delta_log" / f"{0:020d}.json").exists()
    # The ETL copied the inputs through their newest versions (with no `etl.finished_runs`).
    unified_commit(lake, ["m-1"], {t: lake.latest_version(t) for t in INPUT_TABLES})
    result = evaluate()
    assert isinstance(result, SensorResult)
    assert [r.partition_key for r in result.run_requests] == ["m"]
