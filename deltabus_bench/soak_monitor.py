"""What a soak samples at every window's end by wall clock: CPU per component, resident
memory per process, the store's objects and bytes under the run's prefix, requests per
second by class, and the load average (`WindowMonitor`, a thread; `ObjectCounter`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from deltabus_bench.cost import OPERATIONS, RequestMeter
from deltabus_bench.environment import machine_busy, process_cpu_s, process_tree_cpu_s

log = logging.getLogger("deltabus_bench")

MB = 1024 * 1024


def _checkpoint_version(rel: str) -> int | None:
    """The version of a checkpoint file (`<table>/_delta_log/<version>.checkpoint...parquet`),
    None for any other object."""
    head, _, name = rel.rpartition("/")
    if not head.endswith("_delta_log") or ".checkpoint." not in name:
        return None
    digits = name.split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


class ObjectCounter:
    """Objects and bytes under one lake prefix, by table, listed directly (MinIO: the
    endpoint whose metrics are read, not a store profile's proxy; ListObjectsV2 pages of
    1,000, counted so the per-window LIST rate can leave them out)."""

    def __init__(self, lake) -> None:
        self.lake = lake
        self._client = None

    def count(self) -> dict[str, Any] | None:
        """{"objects", "bytes", "log_objects", "by_table": {table: {"objects", "bytes",
        "checkpoint_bytes"}}, "list_requests"}; None when the listing failed (logged).
        `checkpoint_bytes`: the size of the table's newest checkpoint (0: none yet)."""
        try:
            if self.lake.is_local:
                return self._count_local()
            return self._count_s3()
        except Exception as exc:  # noqa: BLE001 - a missing figure, not a failed run
            log.warning("could not list the lake's objects: %s", exc)
            return None

    def _tally(self, items) -> dict[str, Any]:
        by: dict[str, dict[str, int]] = {}
        newest: dict[str, int] = {}  # table -> version of its newest checkpoint
        objects = size = log_objects = 0
        for rel, nbytes in items:
            table = rel.split("/", 1)[0] if "/" in rel else "(top level)"
            t = by.setdefault(table, {"objects": 0, "bytes": 0, "checkpoint_bytes": 0})
            t["objects"] += 1
            t["bytes"] += nbytes
            objects += 1
            size += nbytes
            log_objects += "/_delta_log/" in f"/{rel}"
            version = _checkpoint_version(rel)
            if version is not None:
                if version > newest.get(table, -1):
                    newest[table] = version
                    t["checkpoint_bytes"] = 0
                if version == newest[table]:  # a multi-part checkpoint adds up
                    t["checkpoint_bytes"] += nbytes
        return {
            "objects": objects,
            "bytes": size,
            "log_objects": log_objects,
            "by_table": dict(sorted(by.items())),
        }

    def _count_local(self) -> dict[str, Any]:
        root = Path(self.lake.root)

        def walk():
            for dirpath, _, files in os.walk(root):
                for f in files:
                    p = Path(dirpath) / f
                    yield str(p.relative_to(root)), p.stat().st_size

        return {**self._tally(walk()), "list_requests": 0}

    def _count_s3(self) -> dict[str, Any]:
        if self._client is None:
            self._client = self.lake.s3_client(read_timeout=30, attempts=3)
        s = self.lake.settings
        prefix = f"{s.prefix.strip('/')}/"
        pages = 0

        def walk():
            nonlocal pages
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=s.bucket, Prefix=prefix):
                pages += 1
                for obj in page.get("Contents", []):
                    yield obj["Key"][len(prefix) :], int(obj["Size"])

        out = self._tally(walk())
        return {**out, "list_requests": pages}


# -- processes and the machine, at every window's end ----------------------------------------


class WindowMonitor(threading.Thread):
    """Samples CPU, resident memory, objects, requests and load at each window's end.

    Window k spans wall time [t0 + k W, t0 + (k + 1) W) with t0 the end of the warm-up.
    Between ends it samples the 1-minute load average and every process's RSS once a
    second (for the window's mean load and peak RSS); nothing it keeps grows with the
    run but the list of finished windows. `on_window(k)` is called after window k ends.
    """

    TICK_S = 1.0

    def __init__(
        self,
        *,
        window_s: float,
        windows: int,
        objects: ObjectCounter | None,
        requests: RequestMeter | None,
        on_window: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(name="soak-window-monitor", daemon=True)
        self.window_s = window_s
        self.n = windows
        self.objects = objects
        self.requests = requests
        self.on_window = on_window
        self.pids: dict[str, int] = {}
        self.trees: set[str] = set()
        self.records: list[dict[str, Any]] = []
        self.t0: float | None = None  # epoch s
        self._procs: dict[int, psutil.Process] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._prev: dict[str, Any] | None = None
        self._load: list[float] = []
        self._rss_peak: dict[str, float] = {}
        self._last: dict[str, tuple[int, float, float]] = {}
        self._own_list = 0

    def watch(self, name: str, pid: int | None, tree: bool = False) -> None:
        """Account `pid` as component `name` (CPU of its whole tree with `tree`)."""
        if pid is None:
            return
        with self._lock:
            self.pids[name] = pid
            if tree:
                self.trees.add(name)

    def begin(self, t0_epoch_s: float) -> None:
        """Start sampling; window 1 starts at `t0_epoch_s`."""
        self.t0 = t0_epoch_s
        self.start()

    def finish(self, aborted: bool, timeout: float = 120.0) -> None:
        """Wait for the last window's end (or, `aborted`, end the current window now)."""
        if not self.is_alive():
            return
        if aborted:
            self._halt.set()
        self.join(timeout)
        if self.is_alive():
            self._halt.set()
            self.join(30)

    # -- the thread -----------------------------------------------------------------

    def run(self) -> None:
        assert self.t0 is not None
        try:
            if self._halt.wait(max(0.0, self.t0 - time.time())):
                return
            self._prev = self._snapshot()
            for k in range(self.n):
                end = self.t0 + (k + 1) * self.window_s
                stopped = False
                while (left := end - time.time()) > 0:
                    if self._halt.wait(min(self.TICK_S, left)):
                        stopped = True
                        break
                    self._tick()
                snap = self._snapshot()
                record = self._window(k, self._prev, snap, complete=not stopped)
                with self._lock:
                    self.records.append(record)
                self._prev = snap
                if self.on_window is not None:
                    try:
                        self.on_window(k)
                    except Exception:  # noqa: BLE001 - a report file, not the run
                        log.exception("writing the window report failed")
                if stopped:
                    return
        except Exception:  # noqa: BLE001 - the run goes on without window figures
            log.exception("the soak window monitor failed")

    def _proc(self, pid: int) -> psutil.Process:
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = psutil.Process(pid)
        return p

    def _processes(self) -> dict[str, tuple[int, float, float]]:
        """{name: (pid, CPU seconds, RSS MB)} of every watched process; one that has
        exited keeps its last sample (its CPU stopped there, and its memory is what it had
        when last seen: a producer ends with its schedule, a moment before the last
        window does)."""
        with self._lock:
            pids, trees = dict(self.pids), set(self.trees)
        for name, pid in pids.items():
            cpu = process_tree_cpu_s(pid) if name in trees else process_cpu_s(pid)
            try:
                rss = self._proc(pid).memory_info().rss / MB
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                rss = None
            if cpu is not None and rss is not None:
                self._last[name] = (pid, cpu, rss)
        return {n: v for n, v in self._last.items() if pids.get(n) == v[0]}

    def _tick(self) -> None:
        if hasattr(os, "getloadavg"):
            self._load.append(os.getloadavg()[0])
        for name, (_, _, mb) in self._processes().items():
            self._rss_peak[name] = max(self._rss_peak.get(name, 0.0), mb)

    def _snapshot(self) -> dict[str, Any]:
        procs = self._processes()
        cpu = {name: (pid, cpu_s) for name, (pid, cpu_s, _) in procs.items()}
        snap: dict[str, Any] = {
            "t": time.monotonic(),
            "epoch": time.time(),
            "cpu": cpu,
            "machine": machine_busy(),
            "requests": self.requests.scrape() if self.requests else None,
            "own_list": self._own_list,
        }
        objects = self.objects.count() if self.objects else None
        if objects is not None:
            self._own_list += objects.pop("list_requests", 0)
        snap["objects"] = objects
        snap["rss_mb"] = {name: mb for name, (_, _, mb) in procs.items()}
        snap["load"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        return snap

    def _window(
        self, k: int, a: dict[str, Any], b: dict[str, Any], complete: bool
    ) -> dict[str, Any]:
        wall = max(1e-9, b["t"] - a["t"])
        cpu = {
            name: round(100 * (v - a["cpu"][name][1]) / wall, 1)
            for name, (pid, v) in b["cpu"].items()
            if name in a["cpu"] and a["cpu"][name][0] == pid
        }
        busy = None
        if a["machine"] and b["machine"] and b["machine"][1] > a["machine"][1]:
            busy = (b["machine"][0] - a["machine"][0]) / (b["machine"][1] - a["machine"][1])
        requests = None
        if a["requests"] is not None and b["requests"] is not None:
            delta = {c: b["requests"][c] - a["requests"][c] for c in b["requests"]}
            # This monitor's own listings (taken after each scrape) are not the pipeline's.
            own = b["own_list"] - a["own_list"]
            delta["LIST"] = max(0.0, delta["LIST"] - own)
            requests = {c: round(v / wall, 2) for c, v in delta.items()}
            requests["total"] = round(sum(requests[c] for c in OPERATIONS), 2)
            requests["monitor_list_requests"] = own
        peak = {n: round(max(v, b["rss_mb"].get(n, 0.0)), 1) for n, v in self._rss_peak.items()}
        for n, v in b["rss_mb"].items():
            peak.setdefault(n, round(v, 1))
        loads = self._load
        record = {
            "window": k + 1,
            "complete": complete,
            "wall_s": round(wall, 1),
            "cpu_pct_of_one_core": cpu,
            "machine_busy_pct_of_all_cores": None if busy is None else round(100 * busy, 1),
            "rss_mb": {n: round(v, 1) for n, v in b["rss_mb"].items()},
            "rss_peak_mb": peak,
            "objects": b["objects"],
            "requests_per_s": requests,
            "load_average": {
                "1m_mean": round(sum(loads) / len(loads), 2) if loads else None,
                "1m_max": round(max(loads), 2) if loads else None,
                "at_end": [round(x, 2) for x in b["load"]] if b["load"] else None,
            },
        }
        self._load, self._rss_peak = [], {}
        return record

    def finished(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records)
