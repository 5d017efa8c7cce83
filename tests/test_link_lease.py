"""`deltabus link NAME --target STREAM -- PROGRAM`: replicas of a Pathway link program
share its partitions by leases in the lake, each running the program for the partitions
it holds. A replica SIGKILLed mid-stream (with its program) loses its partitions to the
survivor, whose program restarts with all of them, and every order lands once.

Real MinIO, real replica processes running `tests.bus_pathway_worker` (link `eur-pw`:
orders -> orders_eur) through the public `Link`; the verdicts read the lease records,
the output tables' fence epochs and the output rows back independently.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

import deltabus
from deltabus.bus.groups import Group, now_ms
from deltabus.delta.lake import Lake
from tests.bus_worker import ID_BASE
from tests.conftest import lake_env, run_cli
from tests.test_transform_lease import ORDERS, claimant, eur_tables, feed_orders, ids_in

REPO = Path(__file__).resolve().parent.parent
GROUP = "link.eur-pw"
TTL_S = 3.0


class Replica:
    """One `deltabus link` replica in a session of its own (its program too)."""

    def __init__(self, lake: Lake, tmp_path: Path, name: str) -> None:
        self.name = name
        self.ready = tmp_path / f"{name}.ready"
        self.log = tmp_path / f"{name}.log"
        self.out = tmp_path / f"{name}.out"
        env = lake_env(lake) | {"PYTHONPATH": str(REPO)}
        args = [sys.executable, "-m", "deltabus", "--json", "link", "eur-pw"]
        args += ["--target", "orders_eur", "--lease-ttl-s", str(TTL_S)]
        args += ["--ready-file", str(self.ready), "--"]
        args += [sys.executable, "-m", "tests.bus_pathway_worker"]
        with open(self.log, "wb") as err, open(self.out, "wb") as out:
            self.process = subprocess.Popen(
                args, env=env, cwd=tmp_path, stdout=out, stderr=err, start_new_session=True
            )
        self.member = ""

    def wait_ready(self) -> Replica:
        deadline = time.monotonic() + 60
        while not self.ready.exists():
            self.check_alive()
            assert time.monotonic() < deadline, f"{self.name} not ready: {self.tail()}"
            time.sleep(0.1)
        self.member = json.loads(self.ready.read_text())["member"]
        return self

    def children(self) -> set[int]:
        try:
            return {k.pid for k in psutil.Process(self.process.pid).children()}
        except psutil.NoSuchProcess:
            return set()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def check_alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"{self.name} exited with {code}: {self.tail()}"

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> dict:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not stop on SIGTERM: {self.tail()}") from None
        assert self.process.returncode == 0, self.tail()
        return json.loads(self.out.read_text().strip().splitlines()[-1])


def holders(lake: Lake) -> dict[str, str | None]:
    group = Group(lake, GROUP)
    found = {}
    for table in eur_tables():
        lease = group.lease(table)
        found[table] = None if lease is None or lease.free(now_ms()) else lease.member
    return found


def running(lake: Lake, replicas: list[Replica]) -> bool:
    """Every output table is claimed by the program of the replica holding its lease."""
    held = holders(lake)
    by_member = {r.member: r for r in replicas}
    for table in eur_tables():
        holder = by_member.get(held[table] or "")
        if holder is None or claimant(lake, table) not in holder.children():
            return False
    return True


def wait_until(what: str, check, replicas: list[Replica], timeout: float = 240) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        for replica in replicas:
            replica.check_alive()
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.3)


def test_link_replicas_share_the_partitions_and_a_killed_ones_move(
    minio_lake: Lake, tmp_path: Path
) -> None:
    lake = minio_lake
    hold = threading.Event()
    done = feed_orders(deltabus.Bus(lake), hold)
    a = Replica(lake, tmp_path, "a").wait_ready()
    b = Replica(lake, tmp_path, "b").wait_ready()
    replicas = [a, b]
    try:

        def split() -> bool:
            counts = Counter(holders(lake).values())
            return counts == Counter({a.member: 2, b.member: 2}) and running(lake, replicas)

        wait_until("a 2/2 split, each replica's program running its partitions", split, replicas)
        wait_until(
            "300 orders linked", lambda: sum(ids_in(lake, eur_tables()).values()) >= 300, replicas
        )
        a.kill()
        assert not done.is_set(), "the producer finished before a replica was killed"
        hold.set()

        def survivor_runs_all() -> bool:
            return set(holders(lake).values()) == {b.member} and running(lake, [b])

        wait_until("the survivor holding and running every partition", survivor_runs_all, [b])
        assert done.wait(180)
        expected = {3 * ID_BASE + o for o in range(ORDERS)}
        wait_until(
            "every order in orders_eur", lambda: set(ids_in(lake, eur_tables())) == expected, [b]
        )
        counted = ids_in(lake, eur_tables())
        assert max(counted.values()) == 1
        report = b.stop()
        assert report["group"] == GROUP and report["held_most"] == 4, report
        assert set(holders(lake).values()) == {None}, "a replica that stops releases its leases"
    finally:
        for replica in replicas:
            if replica.process.poll() is None:
                replica.kill()


def test_a_link_runs_only_its_partitions(
    minio_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`partitions` limits what a program reads, writes and claims; out-of-range ones and
    a malformed list from the environment are refused."""
    from deltabus.adapters import link_lease
    from deltabus.connectors.pathway import link as link_module
    from deltabus.connectors.pathway.link import Link

    assert (link_module.LINK_ENV, link_module.PARTITIONS_ENV) == (
        link_lease.LINK_ENV,
        link_lease.PARTITIONS_ENV,
    )
    bus = deltabus.Bus(minio_lake)
    feed_orders(bus, threading.Event())
    link = Link(bus, "eur-pw", source="orders", target="orders_eur", partitions=[2, 0])
    assert link.partitions == [0, 2]
    assert sorted(link.outputs()) == [0, 2]
    assert claimant(minio_lake, "orders_eur-p2") == os.getpid()
    assert claimant(minio_lake, "orders_eur-p1") is None
    link.close()
    with pytest.raises(deltabus.ConfigError, match=r"are not partitions of orders_eur \(0..3\)"):
        Link(bus, "eur-pw", source="orders", target="orders_eur", partitions=[4])
    monkeypatch.setenv(link_module.LINK_ENV, "eur-pw")
    monkeypatch.setenv(link_module.PARTITIONS_ENV, "3")
    assert Link(bus, "eur-pw", source="orders", target="orders_eur").partitions == [3]
    assert Link(bus, "other", source="orders", target="orders_eur").partitions == [0, 1, 2, 3]
    monkeypatch.setenv(link_module.PARTITIONS_ENV, "1,x")
    with pytest.raises(deltabus.ConfigError, match="is not a list of partition indices"):
        Link(bus, "eur-pw", source="orders", target="orders_eur")
    env = lake_env(minio_lake)
    result = run_cli(["link", "eur-pw", "--target", "orders_eur"], env, tmp_path, timeout=60)
    assert result.returncode == 2 and "no link program to run" in result.stderr
