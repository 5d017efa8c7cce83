"""Measure `deltabus etl --lease` child layouts on a loopback MinIO (ADR 0042).

    .venv/bin/python -m tools.lease_bench takeover --children per-batch [--no-spare]
    .venv/bin/python -m tools.lease_bench steady --children per-partition --rate 10000

takeover: two replicas split a 4-partition lake while a producer streams 2000 msg/s; one
replica is killed (its whole process group) once it has committed rows and the other's
spare is loaded. Prints, in seconds after the kill: when the survivor holds the dead
one's leases, when its children claim those tables, when the first rows of the new
claims commit, and the longest pause in the commits of the survivor's own partitions.

steady: one replica holds all 4 partitions; a producer sends `--rate` msg/s for
`--seconds`. Prints the CPU seconds of the replica and all its children per million
messages, and their summed RSS at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from deltabus.adapters.etl_lease import GROUP
from deltabus.apps.timezones.layout import TimezoneLayout, ensure_layout
from deltabus.bus.fence import current_epoch, epoch_owner
from deltabus.bus.groups import Group, now_ms
from deltabus.core.processes import child_env
from deltabus.delta.lake import Lake
from deltabus.delta.tables import iter_commits, meta
from tools.scratch_minio import scratch_lake

FOUR = TimezoneLayout(4)


def replica(env: dict, work: Path, name: str, children: str, spare: bool, ttl: float) -> dict:
    ready = work / f"{name}.ready"
    args = [sys.executable, "-m", "deltabus", "--json", "etl", "--mode", "continuous", "--lease"]
    args += ["--lease-ttl-s", str(ttl), "--lease-children", children, "--commit-interval-ms"]
    args += ["100", "--ready-file", str(ready), "--lease-spare" if spare else "--no-lease-spare"]
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - open for the process's life
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=log, start_new_session=True)
    while not ready.exists():
        assert proc.poll() is None, (work / f"{name}.log").read_text()[-3000:]
        time.sleep(0.05)
    record = json.loads(ready.read_text())
    return {"proc": proc, "member": record["member"], "dir": Path(record["children_dir"])}


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def kids(r: dict) -> set[int]:
    return {p.pid for p in tree(r["proc"].pid)[1:]}


def claimed_by(lake: Lake, p: int) -> int | None:
    if not lake.exists(FOUR.unified_of(p)):
        return None
    dt = lake.open(FOUR.unified_of(p))
    return (epoch_owner(dt, current_epoch(dt)) or {}).get("pid")


def holders(lake: Lake) -> dict[int, str | None]:
    group = Group(lake, GROUP)
    out = {}
    for p, table in enumerate(FOUR.unified_tables):
        lease = group.lease(table)
        out[p] = None if lease is None or lease.free(now_ms()) else lease.member
    return out


def row_commits(lake: Lake, p: int) -> list[tuple[float, int]]:
    """(commit time s, epoch) of every commit with rows, oldest first."""
    dt = lake.open(FOUR.unified_of(p))
    found = []
    for info in iter_commits(dt, 2000):
        if int((info.get("operationMetrics") or {}).get("numOutputRows", 0)) > 0:
            found.append((info["timestamp"] / 1000, meta(info, "etl.epoch")))
    return sorted(found)


def wait(check, timeout: float) -> float:  # noqa: ANN001
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError
        time.sleep(0.05)
    return time.monotonic() - start


def produce(env: dict, rate: int, seconds: float, run: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "deltabus", "produce", "--rate", str(rate), "--duration"]
        + [str(seconds), "--run-id", run, "--commit-interval-ms", "100"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def takeover(lake: Lake, env: dict, work: Path, children: str, spare: bool, ttl: float) -> dict:
    a = replica(env, work, "a", children, spare, ttl)
    b = replica(env, work, "b", children, spare, ttl)
    try:
        wait(
            lambda: (
                sorted(map(str, holders(lake).values())) == sorted([a["member"], b["member"]] * 2)
            ),
            90,
        )
        mine = {p for p, m in holders(lake).items() if m == a["member"]}
        wait(lambda: all(claimed_by(lake, p) in kids(a) | kids(b) for p in range(4)), 180)
        prod = produce(env, 2000, 40, "takeover")
        theirs = sorted(set(range(4)) - mine)
        wait(lambda: all(row_commits(lake, p) for p in range(4)), 60)

        def loaded(r: dict) -> bool:
            return any(int(f.read_text()) in kids(r) for f in r["dir"].glob("*.spare"))

        if spare:
            wait(lambda: loaded(a), 120)
        time.sleep(3)
        os.killpg(b["proc"].pid, signal.SIGKILL)
        died = time.time()
        held = wait(lambda: all(holders(lake)[p] == a["member"] for p in theirs), 60)
        claimed = wait(lambda: all(claimed_by(lake, p) in kids(a) for p in theirs), 120)
        claimed = time.time() - died
        epochs = {p: current_epoch(lake.open(FOUR.unified_of(p))) for p in theirs}
        wait(lambda: all(any(e == epochs[p] for _, e in row_commits(lake, p)) for p in theirs), 120)
        first = max(
            min(t for t, e in row_commits(lake, p) if e == epochs[p]) - died for p in theirs
        )
        time.sleep(5)
        pauses = []
        for p in mine:  # the survivor's own partitions: the longest gap around the kill
            times = [t for t, _ in row_commits(lake, p) if died - 5 < t < died + 90]
            pauses.append(max((y - x for x, y in zip(times, times[1:], strict=False)), default=0))
        prod.wait(120)
        return {
            "children": children,
            "spare": spare,
            "ttl_s": ttl,
            "held_s": round(held, 2),
            "claimed_s": round(claimed, 2),
            "first_rows_s": round(first, 2),
            "own_partitions_longest_pause_s": round(max(pauses), 2),
        }
    finally:
        for r in (a, b):
            if r["proc"].poll() is None:
                os.killpg(r["proc"].pid, signal.SIGKILL)


def steady(lake: Lake, env: dict, work: Path, children: str, rate: int, seconds: float) -> dict:
    a = replica(env, work, "a", children, True, 10.0)
    try:
        wait(lambda: all(claimed_by(lake, p) in kids(a) for p in range(4)), 180)
        time.sleep(15)  # the spare loads
        procs = tree(a["proc"].pid)
        before = {p.pid: sum(p.cpu_times()[:4]) for p in procs}
        prod = produce(env, rate, seconds, "steady")
        prod.wait(seconds + 120)
        wait(
            lambda: (
                sum(lake.open(t).to_pyarrow_dataset().count_rows() for t in FOUR.unified_tables)
                >= rate * seconds
            ),
            120,
        )
        procs = tree(a["proc"].pid)
        cpu = sum(sum(p.cpu_times()[:4]) - before.get(p.pid, 0) for p in procs)
        rss = sum(p.memory_info().rss for p in procs)
        return {
            "children": children,
            "processes": len(procs),
            "rate": rate,
            "cpu_s_per_million": round(cpu / (rate * seconds) * 1e6, 1),
            "rss_mb": round(rss / 2**20),
        }
    finally:
        os.killpg(a["proc"].pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["takeover", "steady"])
    parser.add_argument("--children", default="per-batch")
    parser.add_argument("--no-spare", action="store_true")
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    with scratch_lake("lease-bench", "lease") as (lake, work):
        settings = lake.settings
        ensure_layout(lake, 4)
        env = child_env(settings)
        if args.what == "takeover":
            result = takeover(lake, env, work, args.children, not args.no_spare, args.ttl)
        else:
            result = steady(lake, env, work, args.children, args.rate, args.seconds)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
