"""The benchmark verdict on synthetic latency series: one rule for every backbone."""

from __future__ import annotations

from deltabus_bench.verdict import (
    BEHIND,
    KEEPING_UP,
    OVER_BOUND,
    classify,
    p99_bound_s,
)

WARMUP = 5.0


def series(p50: callable, seconds: int = 30) -> list[dict]:  # type: ignore[valid-type]
    """One point per second of send time: p50, p95, p99 as functions of t."""
    out = []
    for t in range(seconds):
        v = p50(t)
        out.append({"t_s": float(t), "p50": v, "p95": v * 1.5, "p99": v * 2})
    return out


def p99_of(points: list[dict]) -> float:
    return max(r["p99"] for r in points if r["t_s"] >= WARMUP)


def test_flat_but_seconds_behind_is_behind():
    """A backlog built early and carried at a constant 7 s is not keeping up."""
    points = series(lambda t: 7.0)
    result = classify(points, WARMUP, p99_of(points), None)
    assert result.verdict == BEHIND
    assert not result.grows and result.backlog_at_end_s == 7.0


def test_messages_never_seen_make_a_run_behind():
    """A run whose ETL never delivered (nothing seen: no latency series at all) or
    delivered part of the messages did not keep up, whatever the seen ones' latencies."""
    empty = classify([], WARMUP, None, 0.1)
    assert empty.verdict == KEEPING_UP  # the series alone cannot tell
    unseen = classify([], WARMUP, None, 0.1, unseen=300_000)
    assert unseen.verdict == BEHIND and unseen.unseen_after_warmup == 300_000
    low = classify(series(lambda t: 0.15), WARMUP, 0.3, 0.1)
    assert classify(series(lambda t: 0.15), WARMUP, 0.3, 0.1, unseen=0) == low
    assert classify(series(lambda t: 0.15), WARMUP, 0.3, 0.1, unseen=5).verdict == BEHIND


def test_growing_lag_is_behind():
    points = series(lambda t: 0.2 + 0.15 * t)
    result = classify(points, WARMUP, p99_of(points), 1.0)
    assert result.verdict == BEHIND and result.grows


def test_flat_low_is_keeping_up():
    points = series(lambda t: 0.15)
    result = classify(points, WARMUP, 0.3, 0.1)
    assert result.verdict == KEEPING_UP


def test_a_spike_that_recovers_is_over_bound():
    points = series(lambda t: 3.0 if t in (14, 15) else 0.15)
    result = classify(points, WARMUP, p99_of(points), 0.1)
    assert result.verdict == OVER_BOUND
    assert not result.grows and result.backlog_at_end_s < result.p99_bound_s


def test_the_bound_follows_the_commit_interval():
    assert p99_bound_s(0.1) == 2.0 and p99_bound_s(1.0) == 5.0 and p99_bound_s(None) == 2.0
    points = series(lambda t: 1.5)  # flat 1.5 s at 1000 ms commits: within 5 s
    assert classify(points, WARMUP, 2.5, 1.0).verdict == KEEPING_UP
    assert classify(points, WARMUP, 2.5, 0.1).verdict == OVER_BOUND


def test_minio_request_counters_become_billing_classes():
    from deltabus_bench.cost import cost_summary, daily_request_cost, parse_metrics

    text = "\n".join(
        [
            "# TYPE minio_api_requests_total counter",
            'minio_api_requests_total{name="GetObject",server="s",type="s3"} 9',
            'minio_api_requests_total{name="HeadObject",server="s",type="s3"} 2',
            'minio_api_requests_total{name="ListObjectsV2",server="s",type="s3"} 4',
            'minio_api_requests_total{name="PutObject",server="s",type="s3"} 3',
            'minio_api_requests_total{name="DeleteMultipleObjects",server="s",type="s3"} 1',
            'minio_api_requests_4xx_errors_total{name="GetObject",server="s",type="s3"} 5',
        ]
    )
    counts = parse_metrics(text)
    assert counts == {"GET": 9, "PUT": 3, "HEAD": 2, "LIST": 4, "DELETE": 1, "OTHER": 0, "404s": 5}
    # 1 PUT/s for a day: 86.4 thousand requests at 0.005 USD per thousand.
    assert daily_request_cost({"PUT": 1.0}) == 0.43
    summary = cost_summary({"etl": 50.0, "minio": 25.0}, 10_000, {"GET": 10.0, "total": 10.0})
    assert summary.cpu_s_per_million_msgs == {"etl": 50.0, "minio": 25.0}
    assert summary.cpu_cores_total == 0.75 and summary.requests_per_million_msgs == 1000.0
