"""The consumer's Kafka-like API on the real MinIO: positions committed on revoke, the
rebalance callbacks, per-partition seek, position, committed, seek_to_time, pause and
resume, and lag in records."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

import deltabus
from deltabus import StreamPartition
from deltabus.bus.groups import Group
from deltabus.core import metrics
from deltabus.delta.lake import Lake
from tests.bus_worker import ORDERS_SCHEMA, order

pytestmark = pytest.mark.timeout(300)
TTL_S = 3.0
P0, P1 = StreamPartition("orders", 0), StreamPartition("orders", 1)


def produce(bus: deltabus.Bus, producer: int, count: int, commits: int = 4) -> None:
    """`count` orders to both partitions (key customer), in `commits` flushes."""
    with bus.producer("orders", f"p{producer}") as p:
        for i in range(count):
            p.send(order(producer, i))
            if (i + 1) % max(1, count // commits) == 0:
                p.flush()


def to_partition(bus: deltabus.Bus, producer: int, partition: int, count: int) -> None:
    """`count` orders, all keyed to `partition` of the two, in one flush."""
    key = next(f"k{i}" for i in range(1000) if deltabus.key_partition(f"k{i}", 2) == partition)
    with bus.producer("orders", f"p{producer}") as p:
        for i in range(count):
            p.send({**order(producer, i), "customer": key})
        p.flush()


def read(consumer: deltabus.Consumer, records: int, timeout: float = 60) -> list:
    """Poll until `records` records came back; the batches, the last one not committed
    (no poll after it)."""
    batches, got = [], 0
    deadline = time.monotonic() + timeout
    while got < records:
        assert time.monotonic() < deadline, f"{got} of {records} records"
        batch = consumer.poll(0.5)
        if batch is not None:
            batches.append(batch)
            got += batch.rows.num_rows
    return batches


def none_within(consumer: deltabus.Consumer, seconds: float = 2.0) -> list:
    found, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = consumer.poll(0.2)
        if batch is not None:
            found.append(batch)
    return found


def settle(consumers: list[deltabus.Consumer], timeout: float = 60) -> None:
    """Rebalance until each member holds one of the two partitions."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.rebalance()
        if sorted(len(c.assigned()) for c in consumers) == [1] * len(consumers):
            return
        time.sleep(0.2)
    pytest.fail(f"no split: {[c.assigned() for c in consumers]}")


@pytest.mark.parametrize("auto_commit", [True, False])
def test_a_revoked_partition_is_committed_so_the_next_holder_reads_nothing_again(
    minio_lake: Lake, auto_commit: bool
) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    produce(bus, 1, 40)
    calls: list[tuple[str, list[StreamPartition]]] = []
    first_box: list[deltabus.Consumer] = []

    def revoked(parts: list[StreamPartition]) -> None:
        calls.append(("revoke", parts))
        if not auto_commit:
            first_box[0].commit()  # a manual-commit application commits here

    first = bus.consumer(
        "orders",
        "billing",
        ttl_s=TTL_S,
        auto_commit=auto_commit,
        on_assign=lambda parts: calls.append(("assign", parts)),
        on_revoke=revoked,
    )
    first_box.append(first)
    second = None
    try:
        assert ("assign", [P0, P1]) in calls
        batches = read(first, 40)
        to_partition(bus, 2, 1, 5)
        batches += read(first, 5)  # the newest batch, of partition 1, is in flight
        positions = {sp: first.position(sp) for sp in (P0, P1)}
        before = {sp: first.committed(sp) for sp in (P0, P1)}
        second = bus.consumer("orders", "billing", ttl_s=TTL_S)
        settle([first, second])
        (moved,) = second.assignment()
        assert before[moved] < positions[moved], "nothing of the moved partition in flight"
        assert ("revoke", [moved]) in calls, calls
        assert second.committed(moved) == positions[moved]
        assert first.committed(moved) == positions[moved]  # read from the group's lease
        again = none_within(second)
        assert again == [], f"redelivered after the rebalance: {again}"
        assert sum(b.rows.num_rows for b in batches) == 45
    finally:
        first.close()
        if second is not None:
            second.close()


def test_on_lost_when_another_member_took_the_lease(minio_lake: Lake) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    produce(bus, 1, 20, commits=2)
    lost: list[list[StreamPartition]] = []
    consumer = bus.consumer("orders", "audit", ttl_s=TTL_S, on_lost=lost.append)
    try:
        read(consumer, 20)
        # Another member writes the next revision of the lease of a partition whose
        # newest batch is not committed yet: the commit finds the lease lost.
        (sp,) = [p for p in (P0, P1) if consumer.committed(p) < consumer.position(p)][:1]
        group = Group(minio_lake, "audit", 60.0, member="intruder")  # held past the test
        table = bus.stream("orders").table(sp.partition)
        group.write(group.lease(table), table, "intruder", 0)
        consumer.commit()
        assert lost == [[sp]]
        assert consumer.assignment() == [P0 if sp == P1 else P1]
    finally:
        consumer.close()


def test_a_member_whose_lease_ended_hands_out_nothing_of_a_partition_taken_over(
    minio_lake: Lake,
) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    produce(bus, 1, 20, commits=2)
    lost: list[list[StreamPartition]] = []
    consumer = bus.consumer("orders", "audit", ttl_s=TTL_S, on_lost=lost.append)
    try:
        read(consumer, 20)
        consumer.commit()
        # Its renewals stop, as for a member cut off from the store, and its leases end;
        # another member takes partition 0 at the committed position.
        consumer._stop.set()
        consumer._thread.join()
        time.sleep(TTL_S + 0.5)
        table = bus.stream("orders").table(0)
        group = Group(minio_lake, "audit", 60.0, member="intruder")  # held past the test
        assert group.take(table, 0) is not None
        to_partition(bus, 2, 0, 10)
        to_partition(bus, 3, 1, 10)
        # Partition 1's lease ended but nobody took it: renewed, its batch handed out.
        # Partition 0's batch is the new holder's alone.
        batches = none_within(consumer, 3.0)
        assert [(b.partition, b.rows.num_rows) for b in batches] == [(1, 10)]
        assert lost == [[P0]]
        assert consumer.assignment() == [P1]
    finally:
        consumer.close()


def test_seek_position_committed_seek_to_time_pause_and_resume(minio_lake: Lake) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    produce(bus, 1, 20, commits=2)
    time.sleep(0.5)
    between = datetime.now(UTC)
    time.sleep(0.5)
    produce(bus, 2, 20, commits=2)
    consumer = bus.consumer("orders", "seeker", ttl_s=TTL_S, auto_commit=False)
    try:
        assert consumer.committed(P0) == 0  # taken from the beginning, nothing committed
        read(consumer, 40)
        consumer.commit()
        assert consumer.committed(P0) == consumer.position(P0) > 0

        consumer.seek_to_time(between)  # the second producer's records only
        again = read(consumer, 20)
        assert {r // 10**9 for b in again for r in b.rows.column("order_id").to_pylist()} == {2}
        assert none_within(consumer, 1.0) == []

        stored = consumer.committed(P1)
        consumer.seek(P1, 0)  # partition 1 from its first version
        assert consumer.position(P1) == 0
        ones = none_within(consumer, 2.0)
        assert ones and {b.partition for b in ones} == {1}
        newest = minio_lake.latest_version(bus.stream("orders").table(1))
        assert consumer.position(P1) == newest + 1
        assert consumer.committed(P1) == stored  # a seek is stored at the next commit

        consumer.seek(P0, "beginning")
        consumer.seek(P1, "beginning")
        consumer.pause([P0])
        assert consumer.paused() == [P0]
        paused_reads = none_within(consumer, 2.0)
        assert paused_reads and {b.partition for b in paused_reads} == {1}
        consumer.resume([P0])
        resumed = none_within(consumer, 2.0)
        assert resumed and {b.partition for b in resumed} == {0}

        with pytest.raises(deltabus.ConfigError):
            consumer.position(StreamPartition("orders", 7))
        with pytest.raises(deltabus.ConfigError):
            consumer.seek_to_time(datetime(2026, 1, 1))  # no time zone
    finally:
        consumer.close()


def test_lag_in_records_counts_what_landed_and_was_not_committed(
    minio_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "_served", True)  # the consumer exports its lag gauges
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    produce(bus, 1, 30, commits=3)
    consumer = bus.consumer("orders", "lagging", ttl_s=TTL_S, auto_commit=False)
    try:
        assert sum(consumer.lag_records().values()) == 30
        described = bus.describe_group("lagging", ["orders"])["partitions"]
        assert sum(p["lag_records"] for p in described.values()) == 30
        read(consumer, 30)
        assert sum(consumer.lag_records().values()) == 30  # read, not committed
        consumer.commit()
        assert consumer.lag_records() == {t: 0 for t in consumer.assigned()}
        produce(bus, 2, 12, commits=2)
        assert sum(consumer.lag_records().values()) == 12
        consumer._lag_exported = float("-inf")  # export at this commit, not 5 s on
        consumer.commit()  # nothing new read: the 12 records stay uncommitted
        gauge = [
            metrics.REGISTRY.get_sample_value(
                "deltabus_consumer_lag_records", {"group": "lagging", "table": t}
            )
            for t in consumer.assigned()
        ]
        assert sum(gauge) == 12
    finally:
        consumer.close()


def test_an_exception_in_a_callback_is_raised_by_the_next_poll(minio_lake: Lake) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")

    def refuse(parts: list[StreamPartition]) -> None:
        raise RuntimeError(f"not ready for {parts}")

    consumer = bus.consumer("orders", "picky", ttl_s=TTL_S, on_assign=refuse)
    try:
        with pytest.raises(RuntimeError, match="not ready"):
            consumer.poll(0.1)
        assert consumer.poll(0.1) is None  # raised once
        assert consumer.assignment() == [P0, P1]  # the rebalance itself went on
    finally:
        consumer.close()
