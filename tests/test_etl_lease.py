"""`deltabus etl --mode continuous --lease`: ETL replicas with no identity share the unified
partitions by leases in the lake; a dead, joining or leaving replica moves partitions,
and every message still lands exactly once.

Real MinIO, real replica processes with their Pathway children; the verdicts read the
lease records and the Delta tables back independently.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from deltabus.adapters.etl_lease import GROUP
from deltabus.apps.timezones.layout import TimezoneLayout, ensure_layout
from deltabus.bus.fence import current_epoch, epoch_owner
from deltabus.bus.groups import Group, now_ms
from deltabus.delta.lake import Lake
from deltabus.delta.tables import iter_commits, meta
from tests.conftest import lake_env, run_cli
from tests.helpers import assert_exactly_once, read_table, wait_for_file

FOUR = TimezoneLayout(4)
TTL_S = 3.0


class Replica:
    """One `deltabus etl --mode continuous --lease` process in a session of its own, so
    that a test can kill its whole process group (its ETL children too)."""

    def __init__(self, env: dict[str, str], tmp_path: Path, name: str, ttl_s: float) -> None:
        self.name = name
        self.ready = tmp_path / f"{name}.ready"
        self.log = tmp_path / f"{name}.log"
        self.out = tmp_path / f"{name}.out"
        args = [sys.executable, "-m", "deltabus", "--json", "etl", "--mode", "continuous"]
        args += ["--lease", "--lease-ttl-s", str(ttl_s), "--commit-interval-ms", "100"]
        args += ["--ready-file", str(self.ready)]
        with open(self.log, "wb") as err, open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                args, env=env, cwd=tmp_path, stdout=out, stderr=err, start_new_session=True
            )
        self.member = ""
        self.terminated = False

    def wait_ready(self) -> Replica:
        wait_for_file(self.ready, self.proc, timeout=60)
        record = json.loads(self.ready.read_text())
        self.member, self.children_dir = record["member"], Path(record["children_dir"])
        return self

    def spare_loaded(self) -> bool:
        """Its spare child has loaded Pathway and waits for partitions."""
        spares = {int(f.read_text()) for f in self.children_dir.glob("*.spare")}
        return bool(spares & set(self.children()))

    def children(self) -> list[int]:
        """The pids of its child processes (ETL children and the spare)."""
        try:
            return [k.pid for k in psutil.Process(self.proc.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill_group(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM, once (a second one may land after the replica's own handler is gone)."""
        if self.proc.poll() is None and not self.terminated:
            self.proc.send_signal(signal.SIGTERM)
            self.terminated = True

    def stop(self, timeout: float = 60) -> int:
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise AssertionError(f"{self.name} did not stop on SIGTERM: {self.tail()}") from None

    def report(self) -> dict:
        return json.loads(self.out.read_text().strip().splitlines()[-1])


def holders(lake: Lake) -> dict[str, str | None]:
    """Each unified partition's holder by its lease record (None: free or ended)."""
    group = Group(lake, GROUP)
    found = {}
    for table in FOUR.unified_tables:
        lease = group.lease(table)
        found[table] = None if lease is None or lease.free(now_ms()) else lease.member
    return found


def wait_for(what: str, check, timeout: float, replicas: list[Replica]) -> float:  # noqa: ANN001
    """Poll `check()` until true; the seconds it took. Fails naming `what`."""
    start = time.monotonic()
    while not check():
        for r in replicas:
            assert r.proc.poll() is None, f"{r.name} exited early: {r.tail()}"
        assert time.monotonic() - start < timeout, f"{what} not within {timeout}s"
        time.sleep(0.1)
    return time.monotonic() - start


def split(lake: Lake, replicas: list[Replica]) -> Counter:
    held = holders(lake)
    return Counter(m for m in held.values() if m is not None and m in {r.member for r in replicas})


def producer(env: dict[str, str], tmp_path: Path, run: str, seconds: float) -> subprocess.Popen:
    """2000 msg/s for `seconds` into the 4-partition inputs, 100 ms windows."""
    return subprocess.Popen(
        [sys.executable, "-m", "deltabus", "produce", "--rate", "2000"]
        + ["--duration", str(seconds), "--run-id", run, "--commit-interval-ms", "100"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def unified_rows(lake: Lake) -> int:
    return sum(read_table(lake, t).height for t in FOUR.unified_tables if lake.exists(t))


def finish(lake: Lake, prod: subprocess.Popen, expected: int, replicas: list[Replica]) -> None:
    """Wait for the producer, then for every message to reach the unified tables."""
    _, err = prod.communicate(timeout=180)
    assert prod.returncode == 0, err[-3000:]
    wait_for("all rows in the unified tables", lambda: unified_rows(lake) >= expected, 120, [])
    for r in replicas:
        assert r.proc.poll() is None, f"{r.name} exited early: {r.tail()}"


def claimed_by(lake: Lake, partition: int) -> int | None:
    """The pid of the ETL holding the newest fence epoch of unified partition `partition`."""
    if not lake.exists(FOUR.unified_of(partition)):
        return None
    dt = lake.open(FOUR.unified_of(partition))
    owner = epoch_owner(dt, current_epoch(dt)) or {}
    return owner.get("pid")


def processing(lake: Lake, replica: Replica) -> list[int]:
    """The partitions whose newest fence epoch a child of `replica` holds."""
    kids = set(replica.children())
    return [p for p in range(4) if claimed_by(lake, p) in kids]


def running(lake: Lake, replicas: list[Replica]) -> bool:
    """Every partition's table is claimed by a child of the replica holding its lease."""
    held = holders(lake)
    by_member = {r.member: r for r in replicas}
    for i, table in enumerate(FOUR.unified_tables):
        holder = by_member.get(held[table] or "")
        if holder is None or claimed_by(lake, i) not in holder.children():
            return False
    return True


def first_rows_s(lake: Lake, partition: int, since: float) -> float | None:
    """Seconds from `since` (epoch s) to the first commit with rows of the table's current
    epoch (its newest claimant's), None before there is one."""
    dt = lake.open(FOUR.unified_of(partition))
    epoch, first = current_epoch(dt), None
    for info in iter_commits(dt, 500):
        if meta(info, "etl.epoch") != epoch:
            break
        if int((info.get("operationMetrics") or {}).get("numOutputRows", 0)) > 0:
            first = info["timestamp"] / 1000 - since
    return first


@pytest.fixture
def four(minio_lake: Lake) -> Lake:
    ensure_layout(minio_lake, 4)
    return minio_lake


def start_two(lake: Lake, env: dict[str, str], tmp_path: Path, ttl_s: float) -> list[Replica]:
    """Replicas a and b, split 2/2, each running its two partitions."""
    a = Replica(env, tmp_path, "a", ttl_s)
    b = Replica(env, tmp_path, "b", ttl_s)
    replicas = [a, b]
    a.wait_ready(), b.wait_ready()
    wait_for(
        "a 2/2 split", lambda: split(lake, replicas) == {a.member: 2, b.member: 2}, 60, replicas
    )
    wait_for("every partition running", lambda: running(lake, replicas), 120, replicas)
    return replicas


def kill_all(replicas: list[Replica]) -> None:
    for r in replicas:
        if r.proc.poll() is None:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait(10)


def test_two_replicas_split_four_partitions_and_a_killed_ones_move_within_the_lease(
    four: Lake, tmp_path: Path
):
    lake, env = four, lake_env(four)
    replicas = []
    try:
        replicas = start_two(lake, env, tmp_path, TTL_S)
        a, b = replicas
        prod = producer(env, tmp_path, "lease", 10)
        time.sleep(4)
        b_parts = processing(lake, b)
        assert len(b_parts) == 2
        # b has committed rows of its own, and a's spare is ready to take over
        wait_for("b's rows", lambda: all(first_rows_s(lake, p, 0) for p in b_parts), 30, replicas)
        wait_for("a's spare", a.spare_loaded, 60, replicas)
        b.kill_group()  # b and its children die at once
        died, died_wall = time.monotonic(), time.time()
        took = wait_for("a holding all four", lambda: split(lake, [a]) == {a.member: 4}, 30, [a])
        print(f"a holds b's partitions {took:.2f}s after b died (lease {TTL_S:g}s)")
        assert took <= TTL_S + 2
        # and processes them: a child of a claims each of b's tables and commits rows
        wait_for(
            "a's children claiming b's partitions",
            lambda: processing(lake, a) == [0, 1, 2, 3],
            60,
            [a],
        )
        print(f"a's children claimed them {time.monotonic() - died:.2f}s after b died")
        wait_for("rows", lambda: all(first_rows_s(lake, p, died_wall) for p in b_parts), 60, [a])
        firsts = [round(first_rows_s(lake, p, died_wall) or 0, 2) for p in b_parts]
        print(f"first rows of the new claims {firsts}s after b died")
        finish(lake, prod, 20_000, [a])
        assert a.stop() == 0, a.tail()
    finally:
        kill_all(replicas)
    assert_exactly_once(lake, expected=20_000)
    report = a.report()
    assert report["takes"] >= 4 and report["lost"] == 0, report
    assert holders(lake) == dict.fromkeys(FOUR.unified_tables)  # a left: all free


def test_a_joining_replica_takes_partitions_from_a_holder_that_stops_them(
    four: Lake, tmp_path: Path
):
    lake, env = four, lake_env(four)
    replicas = []
    try:
        replicas = start_two(lake, env, tmp_path, TTL_S)
        a, b = replicas
        before = holders(lake)
        claimants = {p: claimed_by(lake, p) for p in range(4)}
        prod = producer(env, tmp_path, "join", 10)
        time.sleep(2)
        c = Replica(env, tmp_path, "c", TTL_S).wait_ready()
        replicas.append(c)
        three = [1, 1, 2]
        wait_for(
            "a 3-way split", lambda: sorted(split(lake, replicas).values()) == three, 60, replicas
        )
        after = holders(lake)
        moved = [p for p, t in enumerate(FOUR.unified_tables) if after[t] == c.member]
        assert moved and all(before[FOUR.unified_of(p)] in (a.member, b.member) for p in moved)
        wait_for("c's children claiming", lambda: processing(lake, c) == moved, 60, replicas)
        for p in moved:  # the child that ran it before has stopped (released or fenced)
            assert (
                not psutil.pid_exists(claimants[p])
                or psutil.Process(claimants[p]).status() == psutil.STATUS_ZOMBIE
            ), f"partition {p}'s old child still runs"
        finish(lake, prod, 20_000, replicas)
        for r in replicas:  # all at once: none takes what another gives up on leaving
            r.terminate()
        for r in replicas:
            assert r.stop() == 0, r.tail()
    finally:
        kill_all(replicas)
    assert_exactly_once(lake, expected=20_000)
    reports = [r.report() for r in replicas]
    assert all(r["lost"] == 0 for r in reports), reports
    given_up = sum(r["releases"] for r in reports)
    assert given_up >= len(moved) + 4, reports  # the moves, and every partition on leaving


def test_sigterm_leaves_the_group_and_the_partitions_move_at_once(four: Lake, tmp_path: Path):
    lake, env = four, lake_env(four)
    ttl = 30.0  # far longer than the move may take
    replicas = []
    try:
        replicas = start_two(lake, env, tmp_path, ttl)
        a, b = replicas
        prod = producer(env, tmp_path, "leave", 6)
        time.sleep(2)
        b_children = b.children()
        b.terminate()
        took = wait_for("a holding all four", lambda: split(lake, [a]) == {a.member: 4}, ttl, [a])
        print(f"a holds b's partitions {took:.2f}s after b's SIGTERM (lease {ttl:g}s)")
        assert took < ttl / 3
        assert b.proc.wait(30) == 0, b.tail()
        assert b.report()["releases"] == 2
        alive = [
            p
            for p in b_children
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        assert not alive, f"b's children outlived it: {alive}"
        finish(lake, prod, 12_000, [a])
        assert a.stop() == 0, a.tail()
    finally:
        kill_all(replicas)
    assert_exactly_once(lake, expected=12_000)


def test_a_crashed_child_is_restarted_while_its_lease_is_held(four: Lake, tmp_path: Path):
    lake, env = four, lake_env(four)
    a = Replica(env, tmp_path, "a", TTL_S)
    try:
        a.wait_ready()
        wait_for("a holding all four", lambda: split(lake, [a]) == {a.member: 4}, 60, [a])
        wait_for("every partition running", lambda: running(lake, [a]), 120, [a])
        prod = producer(env, tmp_path, "crash", 6)
        time.sleep(2)
        victim = claimed_by(lake, 0)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_for(
            "another child of a claiming partition 0",
            lambda: (
                claimed_by(lake, 0) not in (None, victim) and processing(lake, a) == [0, 1, 2, 3]
            ),
            60,
            [a],
        )
        finish(lake, prod, 12_000, [a])
        assert split(lake, [a]) == {a.member: 4}  # the leases never moved
        assert a.stop() == 0, a.tail()
    finally:
        kill_all([a])
    assert_exactly_once(lake, expected=12_000)
    assert a.report()["child_failures"] == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--lease"], "--lease runs until stopped: it needs --mode continuous"),
        (["--mode", "continuous", "--lease", "--processes", "2"], "both say which partitions"),
        (["--mode", "continuous", "--lease", "--lease-ttl-s", "0.1"], "the lease time must be"),
        (["--mode", "continuous", "--partition-list", "0,x"], "is not a list of partition"),
    ],
)
def test_lease_options_that_cannot_work_exit_2_with_one_line(
    local_lake: Lake, tmp_path: Path, args: list[str], says: str
):
    result = run_cli(["etl", *args], lake_env(local_lake), tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert says in result.stderr and "Traceback" not in result.stderr
