"""Sticky assignment: a member joining or leaving a group moves only the partitions that
must move, as Kafka's sticky assignor does. Real consumers on the real MinIO."""

from __future__ import annotations

import time

import pytest

import deltabus
from deltabus.bus.groups import sticky_assignment
from deltabus.delta.lake import Lake
from tests.bus_worker import ORDERS_SCHEMA

pytestmark = pytest.mark.timeout(300)
TTL_S = 3.0


def moved(before: dict[str, list[str]], after: dict[str, list[str]]) -> int:
    """Partitions whose member changed (a departed member's count as moved)."""
    owner = {p: m for m, ps in before.items() for p in ps}
    return sum(1 for m, ps in after.items() for p in ps if owner.get(p) != m)


def test_sticky_assignment_moves_only_what_must_move() -> None:
    tables = [f"orders-p{i}" for i in range(6)]
    two = sticky_assignment(tables, ["a", "b"], {})
    assert sorted(len(ps) for ps in two.values()) == [3, 3]
    three = sticky_assignment(tables, ["a", "b", "c"], two)
    assert sorted(len(ps) for ps in three.values()) == [2, 2, 2]
    assert moved(two, three) == 2  # the round-robin deal moved 4
    back = sticky_assignment(tables, ["a", "c"], three)  # b leaves
    assert sorted(len(ps) for ps in back.values()) == [3, 3]
    assert moved(three, back) == 2  # b's two only
    seven = sticky_assignment([f"t{i}" for i in range(7)], ["a", "b", "c"], {})
    assert sorted(len(ps) for ps in seven.values()) == [2, 2, 3]


def held_by(consumers: list[deltabus.Consumer]) -> dict[str, list[str]]:
    return {c.member: c.assigned() for c in consumers}


def settle(consumers: list[deltabus.Consumer], timeout: float = 60) -> dict[str, list[str]]:
    """Rebalance until the members hold the 6 partitions between them, evenly."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.rebalance()
        held = held_by(consumers)
        counts = sorted(len(ps) for ps in held.values())
        if sum(counts) == 6 and counts[-1] - counts[0] <= 1:
            return held
        time.sleep(0.2)
    pytest.fail(f"the group did not settle: {held_by(consumers)}")


def test_a_join_and_a_leave_move_two_of_six_partitions(minio_lake: Lake) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=6, key="customer")
    first = bus.consumer("orders", "sticky", ttl_s=TTL_S)
    second = bus.consumer("orders", "sticky", ttl_s=TTL_S)
    members = [first, second]
    try:
        two = settle(members)
        third = bus.consumer("orders", "sticky", ttl_s=TTL_S)
        members.append(third)
        three = settle(members)
        assert moved(two, three) == 2, (two, three)
        second.close()  # leaves: its two partitions, and only those, move
        members.remove(second)
        after = settle(members)
        assert moved(three, after) == 2, (three, after)
    finally:
        for consumer in members:
            consumer.close()


def test_members_whose_clocks_disagree_still_agree(minio_lake: Lake) -> None:
    """One member's clock a minute ahead (an injected clock, far beyond the 3 s lease
    time): the two still see each other live, split the partitions and keep them."""
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    steady = bus.consumer("orders", "skew", ttl_s=TTL_S)
    ahead = bus.consumer("orders", "skew", ttl_s=TTL_S)
    ahead.group.clock = lambda: time.time() + 60.0
    members = [steady, ahead]
    try:
        deadline = time.monotonic() + 60
        while True:
            for consumer in members:
                consumer.group.heartbeat()
                consumer.rebalance()
            held = held_by(members)
            if sorted(len(ps) for ps in held.values()) == [2, 2]:
                break
            assert time.monotonic() < deadline, held
            time.sleep(0.2)
        assert sorted(ahead.group.live_members()) == sorted(c.member for c in members)
        assert sorted(steady.group.live_members()) == sorted(c.member for c in members)
        for _ in range(int(3 * TTL_S / 0.5)):  # three lease times: nothing moves
            time.sleep(0.5)
            for consumer in members:
                consumer.rebalance()
            assert held_by(members) == held
    finally:
        for consumer in members:
            consumer.close()
