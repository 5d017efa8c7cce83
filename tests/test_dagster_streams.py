"""The streams domain of the Dagster layer against real streams on MinIO: the sensor adds
declared streams as partitions, records their commits, and reports consumer-group lag."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

import deltabus
from deltabus.delta.lake import Lake
from tests.bus_worker import ORDERS_SCHEMA, order
from tests.conftest import use_lake_env


@pytest.fixture
def lake(minio_lake: Lake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Lake:
    use_lake_env(monkeypatch, minio_lake)  # the resources read the environment
    return minio_lake


def resources() -> dict:
    from resources import default_resources

    return default_resources()


def produce(bus: deltabus.Bus, start: int, count: int) -> None:
    with bus.producer("orders", "dagster-test", commit_interval_ms=0) as producer:
        rows = [order(5, o) for o in range(start, start + count)]
        producer.send_batch(pa.Table.from_pylist(rows))


def test_streams_sensor_records_streams_and_group_lag(lake: Lake) -> None:
    from assets.streams.assets import GROUP_LAG_CHECK, STREAMS_ASSET, streams_sensor

    bus = deltabus.Bus(lake)
    instance = DagsterInstance.ephemeral()

    def evaluate(cursor: str | None) -> SensorResult | SkipReason:
        context = build_sensor_context(instance=instance, cursor=cursor, resources=resources())
        return streams_sensor(context)

    empty = evaluate(None)
    assert isinstance(empty, SkipReason) and "0 stream(s)" in (empty.skip_message or "")

    orders = bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    added = evaluate(None)
    assert isinstance(added, SensorResult)
    (request,) = added.dynamic_partitions_requests
    assert list(request.partition_keys) == ["orders"]
    instance.add_dynamic_partitions("streams", ["orders"])

    produce(bus, 0, 40)
    with bus.consumer("orders", group="billing") as consumer:
        while consumer.poll(0.5) is not None:
            pass
        consumer.commit()
    produce(bus, 40, 40)  # landed after billing committed: billing is behind by it

    recorded = evaluate(added.cursor)
    assert isinstance(recorded, SensorResult)
    (materialization,) = [e for e in recorded.asset_events if isinstance(e, AssetMaterialization)]
    assert materialization.asset_key.path == [STREAMS_ASSET]
    assert materialization.partition == "orders"
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["partitions"] == 2 and metadata["key"] == "customer"
    for table in orders.tables:
        assert metadata[f"{table}_version"] == bus.lake.open(table).version()
    (check,) = [e for e in recorded.asset_events if isinstance(e, AssetCheckEvaluation)]
    assert check.check_name == GROUP_LAG_CHECK and check.passed
    lags = {k: v.value for k, v in check.metadata.items()}
    behind = [lags[f"billing/{t}"] for t in orders.tables]
    assert sum(behind) >= 1 and lags["max_versions_behind"] == max(behind)

    # Nothing new: no event, the cursor keeps what was recorded.
    again = evaluate(recorded.cursor)
    assert isinstance(again, SkipReason)

    # The same check on demand (from the UI, or a job): the same verdict.
    from assets.streams.assets import consumer_groups_within_lag
    from resources.lake import LakeResource

    on_demand = consumer_groups_within_lag(lake=LakeResource())
    assert on_demand.passed
    assert on_demand.metadata["max_versions_behind"].value == max(behind)


def test_maintenance_job_compacts_every_declared_stream(lake: Lake) -> None:
    from definitions import build_definitions

    bus = deltabus.Bus(lake)
    orders = bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    kept = bus.create_stream(
        "audit", ORDERS_SCHEMA, settings=deltabus.StreamSettings(compaction=False)
    )
    for start in range(0, 100, 20):  # five flushes: up to five files per partition
        produce(bus, start, 20)
        with bus.producer("audit", "auditor", commit_interval_ms=0) as producer:
            producer.send(order(6, start))

    def files(stream: deltabus.Stream) -> list[int]:
        return [len(bus.lake.open(t).file_uris()) for t in stream.tables]

    assert max(files(orders)) > 1 and files(kept) == [5]
    job = build_definitions(resources()).resolve_job_def("maintenance_job")
    result = job.execute_in_process(
        run_config={"ops": {"maintain_lake": {"config": {"retention_hours": 0}}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    assert files(orders) == [1, 1]
    assert files(kept) == [5]  # its settings turn compaction off
    total = sum(bus.lake.open(t).to_pyarrow_table().num_rows for t in orders.tables)
    assert total == 100
