"""Soak in windows (`deltabus bench --soak-minutes M --window-minutes W`): figures per
window, aggregated as the run goes, in memory that does not grow with the run's length.

- `WindowedLatency` takes the consumer's batches in place of keeping them: every first
  sighting of a message goes into the `LogHistogram` of the window of its scheduled send
  time; `SeenSet` tells first sightings from repeats in a bounded sliding bitmap per
  producer run.
- `WindowMonitor` (a thread) samples the processes and the store at every window's end
  by wall clock: CPU per component, resident memory per process, MinIO's object count
  and bytes under the run's prefix, requests per second by class from MinIO's metrics,
  and the load average.
- `SoakWindows` ties both to one run and renders what is known so far
  (deltabus.adapters.bench.soak_report writes it).

Windows start at the end of the warm-up (schedule start + `--warmup`) and are `W`
minutes long in both send time (latency) and wall time (everything else): the schedule
runs in real time, so window k's messages were sent while window k's processes ran.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import psutil
import pyarrow as pa
import pyarrow.compute as pc

from deltabus.adapters.bench.cost import OPERATIONS, RequestMeter
from deltabus.adapters.bench.environment import machine_busy, process_cpu_s, process_tree_cpu_s
from deltabus.adapters.bench.histogram import LogHistogram
from deltabus.adapters.bench.workload import ProducerSpec

log = logging.getLogger("deltabus.adapters.bench")

# A message seen after this many seconds' worth of its run's later messages were seen
# counts as "late or repeated", not as a first sighting (the bitmap is this wide).
SEEN_SPAN_S = 300.0
SEEN_SPAN_MAX = 32_000_000  # bits (bytes: one bool each) per producer run, at most
MB = 1024 * 1024


class SeenSet:
    """Which message indices 0..total-1 of one producer run were seen, in a sliding
    bitmap of `span` entries (memory: `span` bytes, whatever `total`).

    `base` is the lowest index not yet seen; the bitmap covers [base, base + span). An
    index below `base` arrives again (`repeated_or_late`); an index beyond the bitmap
    moves `base` on, counting the unseen indices it passes as `given_up`. With `span`
    wider than the run's out-of-order spread, every first sighting is counted exactly
    once (`unique`).
    """

    CHUNK = 1 << 16

    def __init__(self, total: int, span: int) -> None:
        self.total = int(total)
        self.span = max(1, min(int(span), max(1, self.total)))
        self.bits = np.zeros(self.span, dtype=bool)
        self.bits.fill(False)  # every page resident now: its memory is fixed from the start
        self.base = 0
        self.unique = 0
        self.repeated_or_late = 0
        self.given_up = 0
        self.out_of_range = 0

    def mark(self, idx: np.ndarray) -> np.ndarray:
        """Mark `idx` seen; True where a row is its message's first sighting."""
        idx = np.asarray(idx, dtype=np.int64)
        new = np.zeros(idx.size, dtype=bool)
        valid = (idx >= 0) & (idx < self.total)
        self.out_of_range += int(idx.size - np.count_nonzero(valid))
        cand = valid.copy()
        while True:
            below = cand & (idx < self.base)
            self.repeated_or_late += int(np.count_nonzero(below))
            cand &= ~below
            fits = cand & (idx < self.base + self.span)
            if fits.any():
                self._set(idx, fits, new)
                cand &= ~fits
            self._advance()
            if not cand.any():
                return new
            # Rows beyond the bitmap: give up on the oldest unseen indices to make room.
            self._give_up_to(int(idx[cand].min()) - self.span + 1)

    def _set(self, idx: np.ndarray, mask: np.ndarray, new: np.ndarray) -> None:
        rows = np.flatnonzero(mask)
        pos = idx[rows] % self.span
        _, first = np.unique(pos, return_index=True)
        fresh = np.zeros(rows.size, dtype=bool)
        fresh[first] = True
        fresh &= ~self.bits[pos]
        self.bits[pos] = True
        new[rows[fresh]] = True
        n = int(np.count_nonzero(fresh))
        self.unique += n
        self.repeated_or_late += rows.size - n

    def _segments(self, n: int) -> list[np.ndarray]:
        """Views of the bitmap for indices [base, base + n), n <= span, in order."""
        s = self.base % self.span
        if s + n <= self.span:
            return [self.bits[s : s + n]]
        return [self.bits[s:], self.bits[: s + n - self.span]]

    def _advance(self) -> None:
        """Move `base` past every index seen in a row from it, clearing their bits."""
        while self.base < self.total:
            s = self.base % self.span
            seg = self.bits[s : min(self.span, s + self.total - self.base, s + self.CHUNK)]
            k = int(np.argmin(seg))
            if seg[k]:  # every entry set
                k = seg.size
            seg[:k] = False
            self.base += k
            if k < seg.size:
                return

    def _give_up_to(self, target: int) -> None:
        n = target - self.base
        if n <= 0:
            return
        if n >= self.span:
            self.given_up += n - int(np.count_nonzero(self.bits))
            self.bits[:] = False
        else:
            for seg in self._segments(n):
                self.given_up += seg.size - int(np.count_nonzero(seg))
                seg[:] = False
        self.base = target

    def counts(self) -> dict[str, int]:
        return {
            "unique": self.unique,
            "repeated_or_late": self.repeated_or_late,
            "given_up": self.given_up,
            "out_of_range": self.out_of_range,
        }


def scheduled_before(spec: ProducerSpec, offset_us: float) -> int:
    """How many of `spec`'s messages are due before schedule start + `offset_us`, with the
    producer's own rounding (message i is due at round(i * 1e6 / rate) µs)."""
    step = 1_000_000.0 / spec.rate
    lo, hi = 0, spec.total  # the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if np.round(np.float64(mid) * step) < offset_us:
            lo = mid + 1
        else:
            hi = mid
    return lo


class WindowedLatency:
    """End-to-end latency of first sightings, one `LogHistogram` per window of send time.

    `add` is the consumer's sink (called from its threads): it keeps no row. Latency is
    seen_ms minus the message's scheduled send time (from its index and the producer's
    schedule, as the per-message analysis takes it from `date`); a row whose parsed
    timestamp differs from that schedule is counted in `timestamp_mismatches`.
    """

    def __init__(
        self, specs: list[ProducerSpec], warmup_s: float, window_s: float, windows: int
    ) -> None:
        self.specs = {s.run_id: s for s in specs}
        self.warmup_s = warmup_s
        self.window_s = window_s
        self.n = windows
        self.start_ms: float | None = None
        self.hists = [LogHistogram() for _ in range(windows)]
        self.warmup = LogHistogram()
        self.seen = {
            s.run_id: SeenSet(s.total, min(SEEN_SPAN_MAX, math.ceil(s.rate * SEEN_SPAN_S)))
            for s in specs
        }
        self.rows = 0
        self.retractions = 0
        self.not_produced = 0
        self.timestamp_mismatches = 0
        self.before_start = 0
        self.lock = threading.Lock()

    def begin(self, start_ms: float) -> None:
        """The schedule origin (epoch ms), known once the producers are handed it."""
        self.start_ms = start_ms

    def add(self, batch: pa.Table) -> None:
        """Aggregate one consumer batch (columns message, timestamp, seen_ms, diff)."""
        with self.lock:
            self.rows += batch.num_rows
            if self.start_ms is None:
                self.before_start += batch.num_rows
                return
            inserts = pc.equal(batch["diff"], 1)
            self.retractions += batch.num_rows - int(pc.sum(inserts).as_py() or 0)
            ins = batch.filter(inserts)
            if ins.num_rows == 0:
                return
            matched = 0
            for run_id, spec in self.specs.items():
                # Messages are "<run id>-<index>"; run ids have no "-".
                prefix = f"{run_id}-"
                mine = ins.filter(pc.starts_with(ins["message"], prefix))
                if mine.num_rows == 0:
                    continue
                matched += mine.num_rows
                idx = _indices(mine["message"], len(prefix))
                first = self.seen[run_id].mark(idx)
                if not first.any():
                    continue
                idx = idx[first]
                sent_ms = self.start_ms + np.round(idx * (1_000_000.0 / spec.rate)) / 1000
                stamp = mine["timestamp"].to_numpy()[first]
                self.timestamp_mismatches += int(np.count_nonzero(np.abs(stamp - sent_ms) > 1e-3))
                latency = mine["seen_ms"].to_numpy()[first] - sent_ms
                self._record(sent_ms, latency)
            self.not_produced += ins.num_rows - matched

    def _record(self, sent_ms: np.ndarray, latency: np.ndarray) -> None:
        assert self.start_ms is not None
        t0 = self.start_ms + self.warmup_s * 1000
        w = np.floor((sent_ms - t0) / (self.window_s * 1000)).astype(np.int64)
        warm = w < 0
        if warm.any():
            self.warmup.record(latency[warm])
        w = np.minimum(w[~warm], self.n - 1)
        latency = latency[~warm]
        for k in np.unique(w):
            self.hists[int(k)].record(latency[w == k])

    def expected(self, k: int) -> int:
        """Messages scheduled in window k (-1: the warm-up)."""
        if k < 0:
            lo_us, hi_us = 0.0, self.warmup_s * 1e6
        else:
            lo_us = (self.warmup_s + k * self.window_s) * 1e6
            hi_us = math.inf if k == self.n - 1 else lo_us + self.window_s * 1e6
        total = 0
        for s in self.specs.values():
            hi = s.total if hi_us == math.inf else scheduled_before(s, hi_us)
            total += hi - scheduled_before(s, lo_us)
        return total

    def snapshot(self) -> tuple[list[LogHistogram], LogHistogram, dict[str, int]]:
        """Copies of the histograms (windows, warm-up) and the accounting counters."""
        with self.lock:
            hists = [_copy(h) for h in self.hists]
            warm = _copy(self.warmup)
            seen = [s.counts() for s in self.seen.values()]
            counts = {
                "rows_seen": self.rows,
                "first_sightings": sum(c["unique"] for c in seen),
                "repeated_or_late": sum(c["repeated_or_late"] for c in seen),
                "given_up": sum(c["given_up"] for c in seen),
                "not_produced": self.not_produced
                + self.before_start
                + sum(c["out_of_range"] for c in seen),
                "retractions": self.retractions,
                "timestamp_mismatches": self.timestamp_mismatches,
            }
        return hists, warm, counts


def _indices(messages: pa.ChunkedArray, skip: int) -> np.ndarray:
    """The integer after the first `skip` characters of every message (-1 where there is
    none: such a row was not produced by the schedule)."""
    rest = pc.utf8_slice_codeunits(messages, skip)
    try:
        return pc.cast(rest, pa.int64()).to_numpy()
    except pa.ArrowInvalid:
        parsed = pl.Series(rest.combine_chunks()).cast(pl.Int64, strict=False).fill_null(-1)
        return parsed.to_numpy()


def _copy(h: LogHistogram) -> LogHistogram:
    out = LogHistogram()
    out.merge(h)
    return out


# -- the store: objects under the run's prefix ---------------------------------------------


class ObjectCounter:
    """Objects and bytes under one lake prefix, by table, listed directly (MinIO: the
    endpoint whose metrics are read, not a store profile's proxy; ListObjectsV2 pages of
    1,000, counted so the per-window LIST rate can leave them out)."""

    def __init__(self, lake) -> None:
        self.lake = lake
        self._client = None

    def count(self) -> dict[str, Any] | None:
        """{"objects", "bytes", "log_objects", "by_table": {table: {"objects", "bytes"}},
        "list_requests"}; None when the listing failed (logged)."""
        try:
            if self.lake.is_local:
                return self._count_local()
            return self._count_s3()
        except Exception as exc:  # noqa: BLE001 - a missing figure, not a failed run
            log.warning("could not list the lake's objects: %s", exc)
            return None

    def _tally(self, items) -> dict[str, Any]:
        by: dict[str, dict[str, int]] = {}
        objects = size = log_objects = 0
        for rel, nbytes in items:
            table = rel.split("/", 1)[0] if "/" in rel else "(top level)"
            t = by.setdefault(table, {"objects": 0, "bytes": 0})
            t["objects"] += 1
            t["bytes"] += nbytes
            objects += 1
            size += nbytes
            log_objects += "/_delta_log/" in f"/{rel}"
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


class SoakWindows:
    """One windowed soak run: the consumer's sink, the monitor, and the report so far."""

    def __init__(
        self,
        *,
        specs: list[ProducerSpec],
        warmup_s: float,
        window_s: float,
        windows: int,
        objects: ObjectCounter | None,
        requests: RequestMeter | None,
        on_window: Callable[[int], None] | None = None,
    ) -> None:
        self.window_s = window_s
        self.n = windows
        self.latency = WindowedLatency(specs, warmup_s, window_s, windows)
        self.monitor = WindowMonitor(
            window_s=window_s,
            windows=windows,
            objects=objects,
            requests=requests,
            on_window=on_window,
        )
        self.start_ms: float | None = None
        self.warmup_s = warmup_s
        self.not_judged: set[str] = set()  # reported, left out of the memory goal

    def begin(self, start_ms: float) -> None:
        """The schedule starts at `start_ms` (epoch ms): window 1 at the warm-up's end."""
        self.start_ms = start_ms
        self.latency.begin(start_ms)
        self.monitor.begin(start_ms / 1000 + self.warmup_s)

    def finish(self, aborted: bool) -> None:
        self.monitor.finish(aborted)

    def windows(self) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, int]]:
        """(windows so far, the warm-up's latency, accounting counters): every window
        whose end the monitor sampled, with its latency as aggregated until now."""
        hists, warm, counts = self.latency.snapshot()
        out = []
        for rec in self.monitor.finished():
            k = rec["window"] - 1
            start = self.warmup_s + k * self.window_s
            out.append(
                {
                    "window": rec["window"],
                    "start_s": round(start, 1),
                    "end_s": round(start + self.window_s, 1),
                    **latency_figures(hists[k], self.latency.expected(k)),
                    **{key: v for key, v in rec.items() if key != "window"},
                }
            )
        warmup = latency_figures(warm, self.latency.expected(-1))
        return out, warmup, counts

    def whole_run(self) -> LogHistogram:
        """All windows' latency together (the warm-up left out)."""
        hists, _, _ = self.latency.snapshot()
        total = LogHistogram()
        for h in hists:
            total.merge(h)
        return total


def latency_figures(h: LogHistogram, expected: int) -> dict[str, Any]:
    """A window's latency: messages scheduled, first sightings, not seen, percentiles (s)."""

    def s(q: float) -> float | None:
        v = h.quantile(q)
        return None if v is None else round(v / 1000, 4)

    return {
        "messages": expected,
        "seen": h.count,
        "not_seen": expected - h.count,
        "p50_s": s(0.5),
        "p90_s": s(0.9),
        "p99_s": s(0.99),
        "p99.9_s": s(0.999),
        "max_s": None if h.count == 0 else round(h.max_ms / 1000, 4),
        "mean_s": None if h.count == 0 else round(h.total_ms / h.count / 1000, 4),
        "histogram": h.as_dict(),
    }
