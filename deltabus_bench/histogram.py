"""Latency histograms with a stated relative error, recorded a NumPy array at a time.

`LogHistogram` keeps counts in logarithmic buckets (as HdrHistogram and DDSketch do): a
bucket spans values whose largest is `GAMMA` times its smallest, and reports the value
that is within `RELATIVE_ERROR` (1 %) of both ends. Its size does not depend on how many
values it holds (about 1,150 counters, 9 KB), so a soak of any length aggregates its
latency in constant memory. Why this and not a library: docs/adr/0006-windowed-latency.md.
"""

from __future__ import annotations

import math

import numpy as np

RELATIVE_ERROR = 0.01
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
MIN_MS = 0.01  # values at or below this share bucket 0 (reported within MIN_MS)
MAX_MS = 1e8  # about 28 hours; above it: the overflow bucket, reported as the exact max
_LOG_GAMMA = math.log(GAMMA)
BUCKETS = math.ceil(math.log(MAX_MS / MIN_MS) / _LOG_GAMMA) + 2  # + bucket 0, + overflow


def bucket_of(values_ms: np.ndarray) -> np.ndarray:
    """Bucket index of every value: 0 for values <= MIN_MS (negatives too), k >= 1 for
    values in (MIN_MS * GAMMA**(k-1), MIN_MS * GAMMA**k], BUCKETS - 1 above MAX_MS."""
    v = np.asarray(values_ms, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.ceil(np.log(np.maximum(v, MIN_MS) / MIN_MS) / _LOG_GAMMA)
    return np.clip(k, 0, BUCKETS - 1).astype(np.int64)


def bucket_value(k: int) -> float:
    """The value bucket `k` reports: within RELATIVE_ERROR of every value in it (bucket 0
    reports MIN_MS / 2, within MIN_MS / 2 of its values)."""
    if k <= 0:
        return MIN_MS / 2
    return 2 * MIN_MS * GAMMA**k / (GAMMA + 1)


class LogHistogram:
    """Counts of millisecond values in logarithmic buckets, with the exact count, sum,
    minimum and maximum beside them.

    `quantile(q)` estimates the order statistic of 0-based rank floor(q * (n - 1)) (NumPy's
    `percentile(..., method="lower")`) within RELATIVE_ERROR of its value (within MIN_MS
    for values at or below MIN_MS; for values above MAX_MS it is the exact maximum).
    Histograms of the same layout add up exactly (`merge`). Not thread-safe: callers that
    record from several threads hold their own lock.
    """

    __slots__ = ("counts", "count", "total_ms", "min_ms", "max_ms", "negative")

    def __init__(self) -> None:
        self.counts = np.zeros(BUCKETS, dtype=np.int64)
        self.count = 0
        self.total_ms = 0.0
        self.min_ms = math.inf
        self.max_ms = -math.inf
        self.negative = 0  # values below zero (clock trouble), recorded in bucket 0

    def record(self, values_ms: np.ndarray) -> None:
        """Add every value of `values_ms` (milliseconds; NaNs are ignored)."""
        v = np.asarray(values_ms, dtype=np.float64)
        v = v[~np.isnan(v)]
        if v.size == 0:
            return
        self.counts += np.bincount(bucket_of(v), minlength=BUCKETS)
        self.count += int(v.size)
        self.total_ms += float(v.sum())
        self.min_ms = min(self.min_ms, float(v.min()))
        self.max_ms = max(self.max_ms, float(v.max()))
        self.negative += int(np.count_nonzero(v < 0))

    def merge(self, other: LogHistogram) -> None:
        """Add `other`'s values to this histogram."""
        self.counts += other.counts
        self.count += other.count
        self.total_ms += other.total_ms
        self.min_ms = min(self.min_ms, other.min_ms)
        self.max_ms = max(self.max_ms, other.max_ms)
        self.negative += other.negative

    def quantile(self, q: float) -> float | None:
        """Estimate (ms) of the order statistic of rank floor(q * (n - 1)); None if empty."""
        if self.count == 0:
            return None
        if not 0 <= q <= 1:
            raise ValueError(f"quantile {q} is not within [0, 1]")
        rank = math.floor(q * (self.count - 1))
        k = int(np.searchsorted(np.cumsum(self.counts), rank, side="right"))
        if k == BUCKETS - 1:
            return self.max_ms  # overflow: no bucket bound above it
        # The exact extremes bound every order statistic: clamping only moves closer.
        return min(max(bucket_value(k), self.min_ms), self.max_ms)

    def mean(self) -> float | None:
        return self.total_ms / self.count if self.count else None

    def sparse(self) -> list[list[int]]:
        """[[bucket, count], ...] of the non-empty buckets: enough to rebuild or re-merge
        the histogram later (`from_sparse`)."""
        nz = np.flatnonzero(self.counts)
        return [[int(k), int(self.counts[k])] for k in nz]

    def as_dict(self) -> dict:
        """The histogram as windows.json stores it: layout, exact figures, sparse buckets."""
        return {
            "relative_error": RELATIVE_ERROR,
            "gamma": GAMMA,
            "min_ms_bucket0": MIN_MS,
            "count": self.count,
            "sum_ms": round(self.total_ms, 3),
            "min_ms": None if self.count == 0 else round(self.min_ms, 3),
            "max_ms": None if self.count == 0 else round(self.max_ms, 3),
            "negative": self.negative,
            "buckets": self.sparse(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> LogHistogram:
        """The inverse of `as_dict` (same layout constants)."""
        h = cls()
        for k, c in data["buckets"]:
            h.counts[int(k)] += int(c)
        h.count = int(data["count"])
        h.total_ms = float(data["sum_ms"])
        if h.count:
            h.min_ms, h.max_ms = float(data["min_ms"]), float(data["max_ms"])
        h.negative = int(data.get("negative", 0))
        return h
