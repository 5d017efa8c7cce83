"""Soak in windows (`deltabus bench --soak-minutes M --window-minutes W`): figures per
window, aggregated as the run goes, in memory that does not grow with the run's length.

- `WindowedLatency` takes the consumer's batches in place of keeping them: every first
  sighting of a message goes into the `LogHistogram` of the window of its scheduled send
  time; `SeenSet` tells first sightings from repeats in a bounded sliding bitmap per
  producer run.
- `WindowMonitor` (a thread, bench.soak_monitor) samples the processes and the store
  at every window's end by wall clock: CPU per component, resident memory per process,
  MinIO's object count and bytes under the run's prefix, requests per second by class
  from MinIO's metrics, and the load average.
- `SoakWindows` ties both to one run and renders what is known so far
  (deltabus_bench.soak_report writes it).

Windows start at the end of the warm-up (schedule start + `--warmup`) and are `W`
minutes long in both send time (latency) and wall time (everything else): the schedule
runs in real time, so window k's messages were sent while window k's processes ran.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from deltabus_bench.cost import RequestMeter
from deltabus_bench.histogram import LogHistogram
from deltabus_bench.soak_monitor import ObjectCounter, WindowMonitor
from deltabus_bench.workload import ProducerSpec

log = logging.getLogger("deltabus_bench")

# A message seen after this many seconds' worth of its run's later messages were seen
# counts as "late or repeated", not as a first sighting (the bitmap is this wide).
SEEN_SPAN_S = 300.0
SEEN_SPAN_MAX = 32_000_000  # bits (bytes: one bool each) per producer run, at most


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
