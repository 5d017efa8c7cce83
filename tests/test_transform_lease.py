"""Transforms on real MinIO with real processes: replicas with no identity share the
output partitions by leases in the lake, a SIGKILLed replica's partitions move to the
survivor, and a second process of one (transform, partition) fences the first; every
order still lands in the output exactly once.

The verdicts read the lease records, the output tables' fence epochs and the output rows
back independently of the workers.
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
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

import deltabus
from deltabus.bus.fence import current_epoch, epoch_owner
from deltabus.bus.groups import Group, now_ms
from deltabus.delta.lake import Lake
from tests.bus_worker import EUR_SCHEMA, ID_BASE, ORDERS_SCHEMA, order
from tests.conftest import lake_env

REPO = Path(__file__).resolve().parent.parent
GROUP = "transform.eur"
ORDERS = 2000
TTL_S = 3.0


class Worker:
    """A `tests.transform_worker` process in a session of its own; its JSON lines are
    collected as they come, its log goes to a file."""

    def __init__(self, lake: Lake, tmp_path: Path, name: str, *args: str) -> None:
        self.name = name
        self.log = tmp_path / f"{name}.log"
        env = lake_env(lake) | {"PYTHONPATH": str(REPO)}
        with open(self.log, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.transform_worker", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.first = self.wait_for(lambda line: "pid" in line)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if predicate(line):
                    return line
            if self.process.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"{self.name} exited: {self.lines[-3:]} {self.tail()}")
            assert time.monotonic() < deadline, f"{self.name}: no such line in {self.lines[-3:]}"
            time.sleep(0.05)

    def check_alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"{self.name} exited with {code}: {self.lines[-3:]} {self.tail()}"

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                return self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"{self.name} did not stop on SIGTERM: {self.tail()}"
                ) from None
        return self.process.returncode


def feed_orders(bus: deltabus.Bus, hold: threading.Event) -> threading.Event:
    """Declare orders and orders_eur (4 partitions) and produce `ORDERS` orders in the
    background, 50 a commit every 0.2 s; the second half waits until `hold` is set, so a
    test acts while orders still come. The event returned is set once all are committed."""
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    bus.create_stream("orders_eur", EUR_SCHEMA, partitions=4, key="customer")
    done = threading.Event()

    def produce() -> None:
        with bus.producer("orders", "shop", commit_interval_ms=0) as producer:
            for start in range(0, ORDERS, 50):
                if start == ORDERS // 2:
                    assert hold.wait(300), "the test never let the producer go on"
                rows = [order(3, o) for o in range(start, start + 50)]
                producer.send_batch(pa.Table.from_pylist(rows))
                producer.flush()
                time.sleep(0.2)
        done.set()

    threading.Thread(target=produce, daemon=True).start()
    return done


def ids_in(lake: Lake, tables: list[str]) -> Counter:
    """How often each order id is in `tables`."""
    found: Counter = Counter()
    for table in tables:
        dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
        found.update(dt.to_pyarrow_table(columns=["order_id"]).column(0).to_pylist())
    return found


def eur_tables() -> list[str]:
    return [f"orders_eur-p{i}" for i in range(4)]


def holders(lake: Lake) -> dict[str, str | None]:
    """Each output partition's holder by its lease record (None: free or ended)."""
    group = Group(lake, GROUP)
    found = {}
    for table in eur_tables():
        lease = group.lease(table)
        found[table] = None if lease is None or lease.free(now_ms()) else lease.member
    return found


def claimant(lake: Lake, table: str) -> int | None:
    """The pid holding the newest fence epoch of `table`."""
    dt = lake.open(table)
    return (epoch_owner(dt, current_epoch(dt)) or {}).get("pid")


def wait_until(what: str, check: Callable[[], bool], workers: list[Worker], timeout: float = 120):  # noqa: ANN201
    deadline = time.monotonic() + timeout
    while not check():
        for worker in workers:
            worker.check_alive()
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.2)


def test_transform_replicas_share_the_partitions_and_a_killed_ones_move(
    minio_lake: Lake, tmp_path: Path
) -> None:
    """Two replicas split the 4 partitions 2/2; one is SIGKILLed mid-stream; the survivor
    takes its partitions (leases and output claims) and every order lands once."""
    lake = minio_lake
    bus = deltabus.Bus(lake)
    hold = threading.Event()
    done = feed_orders(bus, hold)
    a = Worker(lake, tmp_path, "a", "group", str(TTL_S))
    b = Worker(lake, tmp_path, "b", "group", str(TTL_S))
    workers = [a, b]
    try:
        pids = {a.first["member"]: a.process.pid, b.first["member"]: b.process.pid}

        def split_and_running() -> bool:
            held = holders(lake)
            if sorted(Counter(held.values()).values()) != [2, 2] or set(held.values()) != set(pids):
                return False
            return all(claimant(lake, t) == pids[m] for t, m in held.items() if m is not None)

        wait_until("a 2/2 split, each replica running what it holds", split_and_running, workers)
        wait_until(
            "300 orders transformed",
            lambda: sum(ids_in(lake, eur_tables()).values()) >= 300,
            workers,
        )
        a.kill()
        assert not done.is_set(), "the producer finished before a replica was killed"
        hold.set()
        survivor = b.first["member"]

        def survivor_runs_all() -> bool:
            held = holders(lake)
            return set(held.values()) == {survivor} and all(
                claimant(lake, t) == b.process.pid for t in eur_tables()
            )

        wait_until("the survivor holding and running every partition", survivor_runs_all, [b])
        assert done.wait(180)
        expected = {3 * ID_BASE + o for o in range(ORDERS)}
        wait_until(
            "every order in orders_eur", lambda: set(ids_in(lake, eur_tables())) == expected, [b]
        )
        counted = ids_in(lake, eur_tables())
        assert set(counted) == expected and max(counted.values()) == 1
        assert b.stop() == 0, b.tail()
        assert set(holders(lake).values()) == {None}, "a replica that stops releases its leases"
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.kill()


def test_a_second_process_of_a_transform_partition_fences_the_first(
    minio_lake: Lake, tmp_path: Path
) -> None:
    """The newer process claims the output partition; the older one stops at its next
    commit with FencedError, and the partition's orders land once."""
    lake = minio_lake
    bus = deltabus.Bus(lake)
    hold = threading.Event()
    done = feed_orders(bus, hold)
    first = Worker(lake, tmp_path, "first", "one", "0")
    second = None
    try:
        wait_until(
            "orders in orders_eur-p0",
            lambda: sum(ids_in(lake, ["orders_eur-p0"]).values()) > 0,
            [first],
        )
        second = Worker(lake, tmp_path, "second", "one", "0")
        assert claimant(lake, "orders_eur-p0") == second.process.pid
        hold.set()
        fenced = first.wait_for(lambda line: "error" in line, timeout=120)
        assert first.process.wait(30) == 2
        assert fenced["error"] == "FencedError"
        assert "another transform eur took over orders_eur-p0" in fenced["problem"]
        assert f"pid {second.process.pid}" in fenced["problem"]
        assert done.wait(180)
        expected = set(ids_in(lake, ["orders-p0"]))
        wait_until(
            "partition 0's orders in orders_eur-p0",
            lambda: set(ids_in(lake, ["orders_eur-p0"])) == expected,
            [second],
        )
        counted = ids_in(lake, ["orders_eur-p0"])
        assert set(counted) == expected and max(counted.values()) == 1
        holder = bus.output_holder("orders_eur-p0")
        assert holder is not None and holder["described"].startswith("continuous transform eur")
    finally:
        first.stop()
        if second is not None:
            second.stop()
