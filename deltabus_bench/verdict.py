"""Did a run keep up? One rule for every backbone, from the latency-over-time series.

- **behind**: lag grows through the run (the median latency of the last quarter exceeds
  the second quarter's by more than `GROWTH_MIN_S` and `GROWTH_REL` of it, with a rising
  trend), or the backlog when producing ends exceeds the bound: the messages sent last
  waited longer than the bound to be seen, so the consumer was that many seconds of
  traffic behind.
- **over bound**: lag does not grow and the backlog clears, but p99 is above the bound
  (spikes that recover).
- **keeping up**: neither: lag flat and p99 within the bound.

The bound is `max(2 s, 5 x commit interval)`: a healthy pipeline delivers a message within
a few commit intervals (producer commit, ETL pickup, unified commit, consumer poll, with
one interval of queueing each), and 2 s is the floor below which a 100 ms profile's
stalls (a checkpoint, a GC pause) should not count against it. Kafka runs, which have no
commit interval, get the 2 s floor.
"""

from __future__ import annotations

from statistics import median
from typing import Any

import numpy as np

from deltabus_bench.result_parts import Verdict

KEEPING_UP = "keeping up"
OVER_BOUND = "over bound"
BEHIND = "behind"

BOUND_FLOOR_S = 2.0
BOUND_INTERVALS = 5
GROWTH_MIN_S = 0.25  # Q4 median minus Q2 median, at least this ...
GROWTH_REL = 0.25  # ... and this fraction of the Q2 median,
MIN_SLOPE = 0.01  # with a trend of the per-interval median of >= 10 ms per second.
TAIL_FRACTION = 0.1  # the backlog is read off the last tenth of the send-time span


def p99_bound_s(commit_interval_s: float | None) -> float:
    """The p99 a run may have and still count as keeping up."""
    return max(BOUND_FLOOR_S, BOUND_INTERVALS * (commit_interval_s or 0.0))


def lag_growth(series: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """Quarter medians of the per-interval p50 after the warm-up, and its trend (s per s)."""
    post = [r for r in series if r.get("t_s") is not None and r["t_s"] >= warmup_s]
    post = [r for r in post if r.get("p50") is not None]
    if len(post) < 4:
        return {"quarter_p50_s": [], "growth_s": None, "slope_s_per_s": None, "grows": False}
    quarters = [
        median(r["p50"] for r in part) for part in np.array_split(np.array(post, dtype=object), 4)
    ]
    t = np.array([r["t_s"] for r in post], dtype=float)
    y = np.array([r["p50"] for r in post], dtype=float)
    slope = float(np.polyfit(t, y, 1)[0])
    growth = quarters[3] - quarters[1]
    grows = growth > max(GROWTH_MIN_S, GROWTH_REL * quarters[1]) and slope >= MIN_SLOPE
    return {
        "quarter_p50_s": [round(q, 4) for q in quarters],
        "growth_s": round(growth, 4),
        "slope_s_per_s": round(slope, 5),
        "grows": bool(grows),
    }


def backlog_at_end_s(series: list[dict[str, Any]], warmup_s: float) -> float | None:
    """Median latency of the messages sent in the last tenth of the run: how far behind
    (in seconds of traffic) the consumer was when producing ended."""
    post = [r for r in series if r.get("t_s") is not None and r["t_s"] >= warmup_s]
    post = [r for r in post if r.get("p50") is not None]
    if not post:
        return None
    start, end = post[0]["t_s"], post[-1]["t_s"]
    cut = end - max(TAIL_FRACTION * (end - start), 0.0)
    tail = [r["p50"] for r in post if r["t_s"] >= cut]
    return round(median(tail), 4)


def classify(
    series: list[dict[str, Any]],
    warmup_s: float,
    p99_s: float | None,
    commit_interval_s: float | None,
    unseen: int = 0,
) -> Verdict:
    """The verdict of one run, with the figures it rests on. `unseen`: messages after the
    warm-up never seen within the grace period; a run that did not deliver every message
    did not keep up (behind), whatever its seen messages' latencies say."""
    bound = p99_bound_s(commit_interval_s)
    growth = lag_growth(series, warmup_s)
    backlog = backlog_at_end_s(series, warmup_s)
    if unseen or growth["grows"] or (backlog is not None and backlog > bound):
        verdict = BEHIND
    elif p99_s is not None and p99_s > bound:
        verdict = OVER_BOUND
    else:
        verdict = KEEPING_UP
    return Verdict(
        verdict=verdict,
        p99_bound_s=bound,
        backlog_at_end_s=backlog,
        quarter_p50_s=growth["quarter_p50_s"],
        growth_s=growth["growth_s"],
        slope_s_per_s=growth["slope_s_per_s"],
        grows=growth["grows"],
        unseen_after_warmup=unseen,
        rule=(
            f"behind: Q4 p50 - Q2 p50 > max({GROWTH_MIN_S} s, {GROWTH_REL:.0%} of Q2 p50) with a "
            f"p50 trend >= {MIN_SLOPE} s/s, or the last tenth's p50 > {bound:g} s, or a message "
            f"never seen within the grace; over bound: p99 > {bound:g} s "
            f"(= max({BOUND_FLOOR_S:g} s, {BOUND_INTERVALS} x commit interval))"
        ),
    )
