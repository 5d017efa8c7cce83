"""The benchmark's live latency figures: what the progress line shows while a run goes."""

from __future__ import annotations

import time

import numpy as np

from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.delta.lake import Lake
from deltabus_bench.consumer import LiveStats


def test_snapshot_percentiles_match_the_samples() -> None:
    now_ms = time.time() * 1000
    stats = LiveStats(warmup_end_ms=now_ms - 10_000, refresh_s=0)
    rng = np.random.default_rng(7)
    latencies = rng.integers(20, 900, size=5_000).astype(float)
    latencies[:10] = 4_000  # a slow tail that only the running p99 may not ignore
    for chunk in np.array_split(latencies, 50):
        stats.add(now_ms, now_ms - chunk)
    snap = stats.snapshot()
    assert snap["window_p50"] == np.percentile(latencies, 50) / 1000
    assert snap["window_p99"] == np.percentile(latencies, 99) / 1000
    expected_p99_ms = np.sort(latencies)[int(np.ceil(0.99 * latencies.size)) - 1]
    assert abs(snap["running_p99"] - expected_p99_ms / 1000) <= 0.001


def test_warm_up_samples_stay_out_of_the_running_p99() -> None:
    now_ms = time.time() * 1000
    stats = LiveStats(warmup_end_ms=now_ms - 1_000, refresh_s=0)
    stats.add(now_ms, np.array([now_ms - 50_000.0] * 100))  # sent during the warm-up
    assert stats.snapshot()["running_p99"] is None
    stats.add(now_ms, np.array([now_ms - 200.0] * 100))
    assert stats.snapshot()["running_p99"] == 0.2


def test_snapshot_is_reused_within_the_refresh_interval() -> None:
    now_ms = time.time() * 1000
    stats = LiveStats(warmup_end_ms=now_ms - 1_000, refresh_s=60)
    stats.add(now_ms, np.array([now_ms - 100.0]))
    first = stats.snapshot()
    stats.add(now_ms, np.array([now_ms - 5_000.0] * 1000))
    assert stats.snapshot() == first
    stats.refresh_s = 0
    assert stats.snapshot()["window_p99"] > first["window_p99"]


def test_the_producer_reports_progress_as_often_as_the_display_asks(local_lake: Lake) -> None:
    """The bench shows "produced" next to "seen": a producer reporting every 5 s would
    show the consumer seeing messages not produced yet."""
    calls: list[tuple[float, int]] = []
    config = ProducerConfig(rate=2000, count=4000, commit_interval=0.05, run_id="progress")
    report = TimezoneProducer(local_lake, config).run(
        on_progress=lambda p: calls.append((time.monotonic(), p["messages"])),
        progress_every_s=0.25,
    )
    counts = [n for _, n in calls]
    assert report.messages == 4000 and counts[-1] == 4000
    assert counts == sorted(counts)
    assert len(calls) >= 6, calls  # a 2 s run, a report every 0.25 s
    gaps = [b - a for (a, _), (b, _) in zip(calls, calls[1:], strict=False)]
    assert max(gaps[:-1]) < 0.6, gaps
