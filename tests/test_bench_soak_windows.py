"""The soak in windows: the histogram's error bound, the bounded accounting of messages,
the goals, and a 2-minute run on the MinIO fixture that reports every window's fields.

Speed is not asserted (shared 2-core machines): the windows, their fields and the
accounting are.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.core.errors import ConfigError
from deltabus.delta.lake import Lake
from deltabus.delta.retention import oldest_version
from deltabus_bench.analysis import SAMPLES_TABLE
from deltabus_bench.baseline import find_long_runs, long_runs_markdown
from deltabus_bench.config import BenchConfig
from deltabus_bench.delta.maintenance_loop import run_pass
from deltabus_bench.environment import cpu_model, source_commit
from deltabus_bench.histogram import MAX_MS, MIN_MS, RELATIVE_ERROR, LogHistogram
from deltabus_bench.soak_report import (
    evaluate_goals,
    in_force_after_s,
    maintenance_in_window,
    set_maintenance_memory,
)
from deltabus_bench.soak_windows import SeenSet, scheduled_before
from deltabus_bench.workload import ProducerSpec
from tests.conftest import lake_env, minio_settings_for, run_cli

pytestmark = [pytest.mark.slow]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
QUANTILES = (0.0, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0)


def _data_sets(rng: np.random.Generator):
    yield rng.lognormal(5.0, 0.6, 100_000)  # ~150 ms, the benchmark's shape
    yield rng.lognormal(0.0, 2.5, 50_000)  # across many decades
    yield rng.uniform(50, 60, 20_000)  # narrow: every value near a few bucket edges
    yield np.concatenate([rng.normal(150, 10, 99_000), rng.uniform(2_000, 40_000, 1_000)])
    yield rng.exponential(0.02, 10_000)  # mostly below MIN_MS
    yield np.array([42.0])  # one value
    yield np.repeat([5.0, 7.0, 5_000.0], [3, 1, 2])  # ties
    yield np.concatenate([rng.lognormal(4, 1, 1_000), [MAX_MS * 3, MAX_MS * 10]])  # overflow


def test_histogram_quantiles_are_within_the_stated_error_of_the_exact_ones() -> None:
    """Every quantile is within RELATIVE_ERROR of the exact order statistic of rank
    floor(q (n - 1)) (NumPy's 'lower'), within MIN_MS below it, the maximum above MAX_MS;
    batches and merges change nothing."""
    rng = np.random.default_rng(20261126)
    for values in _data_sets(rng):
        whole, merged = LogHistogram(), LogHistogram()
        for part in np.array_split(rng.permutation(values), 7):
            whole.record(part)
            other = LogHistogram()
            other.record(part)
            merged.merge(other)
        assert whole.count == merged.count == values.size
        assert np.array_equal(whole.counts, merged.counts)
        assert whole.min_ms == values.min() and whole.max_ms == values.max()
        assert whole.total_ms == pytest.approx(values.sum())
        for q in QUANTILES:
            exact = float(np.percentile(values, q * 100, method="lower"))
            got = whole.quantile(q)
            assert got is not None and got == merged.quantile(q)
            if exact <= MIN_MS:
                assert abs(got - exact) <= MIN_MS, (q, got, exact)
            elif exact > MAX_MS:  # beyond the buckets (28 h): the exact maximum
                assert got == whole.max_ms
            else:
                assert abs(got - exact) <= RELATIVE_ERROR * exact * (1 + 1e-9), (q, got, exact)
        again = LogHistogram.from_dict(json.loads(json.dumps(whole.as_dict())))
        assert np.array_equal(again.counts, whole.counts) and again.count == whole.count


def test_histogram_size_does_not_depend_on_the_values_it_holds() -> None:
    h = LogHistogram()
    assert h.quantile(0.5) is None and h.mean() is None
    size = h.counts.nbytes
    rng = np.random.default_rng(1)
    for _ in range(20):
        h.record(rng.lognormal(5, 1, 50_000))
    assert h.counts.nbytes == size < 10_000 and h.count == 1_000_000
    h.record(np.array([np.nan, -3.0]))  # NaN ignored; a negative value is counted apart
    assert h.count == 1_000_001 and h.negative == 1


def test_seen_set_counts_first_sightings_in_bounded_memory() -> None:
    rng = np.random.default_rng(7)
    total, span = 200_000, 10_000
    seen = SeenSet(total, span)
    order = np.arange(total) + rng.integers(-3_000, 3_000, total)  # out of order, < span
    idx = np.arange(total)[np.argsort(order, kind="stable")]
    firsts = 0
    for part in np.array_split(idx, 97):
        firsts += int(seen.mark(part).sum())
    assert firsts == seen.unique == total
    assert seen.repeated_or_late == seen.given_up == seen.out_of_range == 0
    assert seen.bits.nbytes == span and seen.base == total
    # Repeats (in and across batches), rows outside the schedule.
    again = SeenSet(100, 50)
    assert again.mark(np.array([3, 3, 1, 0])).tolist() == [True, False, True, True]
    assert again.mark(np.array([1, 2, -1, 100])).tolist() == [False, True, False, False]
    assert (again.unique, again.repeated_or_late, again.out_of_range) == (4, 2, 2)
    # A row far beyond the bitmap gives up on the oldest unseen indices; when one of them
    # arrives after all, it is "repeated or late", never a second first sighting.
    late = SeenSet(1_000, 100)
    late.mark(np.arange(1, 100))
    assert late.mark(np.array([150])).tolist() == [True]
    assert late.given_up == 1 and late.base == 100
    assert late.mark(np.array([0])).tolist() == [False] and late.repeated_or_late == 1


def test_scheduled_before_follows_the_producers_rounding() -> None:
    spec = ProducerSpec("delta", rate=3_333, duration=7, commit_interval=0.1, seed=0, run_id="x")
    offsets = np.round(np.arange(spec.total, dtype=np.int64) * (1_000_000.0 / spec.rate))
    for at_us in (0, 1, 300, 300.1, 1_000_000, 2_500_000.5, 6_999_999, 7_000_000, 1e9):
        assert scheduled_before(spec, at_us) == int(np.count_nonzero(offsets < at_us))


def _window(
    k: int, p99: float, rss: dict[str, float], objects: int | None, checkpoint: int = 1_000
) -> dict:
    return {
        "window": k,
        "start_s": 60 + (k - 1) * 600,
        "end_s": 60 + k * 600,
        "p99_s": p99,
        "rss_mb": rss,
        "objects": None
        if objects is None
        else {
            "objects": objects,
            "bytes": 10 * objects,
            "by_table": {"timezone1": {"objects": objects, "checkpoint_bytes": checkpoint}},
        },
    }


def test_goals_are_evaluated_against_their_targets() -> None:
    steady = [
        _window(k, 0.40 + 0.01 * (k % 2), {"etl": 500 + k, "minio": 300}, 9_000 + (k % 3))
        for k in range(1, 13)
    ]
    goals = evaluate_goals(
        steady, interval_s=600, vacuum_hours=1, log_retention_s=600, retention_s=900
    )
    assert [g["met"] for g in goals] == [True, True, True, True, True]
    assert in_force_after_s(600, 1, 600) == 300 + 3600 + 600
    assert in_force_after_s(600, 1, 600, 7200) == 300 + 7200 + 600
    assert goals[3]["figure"].startswith("9,")  # windows from 75 min after the warm-up on
    assert "GiB" in goals[4]["figure"]

    # Window 1 fills the state: the steady goals start from window 2.
    settling = [
        _window(
            k, 0.2 if k == 1 else 0.4, {"etl": 300 if k == 1 else 500}, 9_000, 10 + 990 * (k > 1)
        )
        for k in range(1, 13)
    ]
    p99, rss, checkpoint, _ = evaluate_goals(
        settling, interval_s=600, vacuum_hours=1, log_retention_s=600
    )
    assert p99["met"] and rss["met"] and checkpoint["met"], (p99, rss, checkpoint)

    drifting = [
        _window(k, 0.4 * (1 + 0.05 * k), {"etl": 500 * (1 + 0.02 * k)}, 1_000 * k, 1_000 * k)
        for k in range(1, 13)
    ]
    p99, rss, checkpoint, objects = evaluate_goals(
        drifting, interval_s=600, vacuum_hours=1, log_retention_s=None
    )
    assert p99["met"] is False and p99["value"] == pytest.approx(1.6 / 1.10 - 1, abs=1e-3)
    assert p99["figure"].endswith("window 12)") and p99["target"] == "within ±15%"
    assert rss["met"] is False and rss["by_process"]["etl"]["window"] == 12
    assert checkpoint["met"] is False and checkpoint["by_table"]["timezone1"]["growth"] == 5.0
    assert rss["figure"].startswith("largest: etl 520 MB in window 2 → 620 MB")
    assert " MiB in window 2 → " in checkpoint["figure"]
    assert objects["met"] is False

    # A store profile's proxies are shown, not judged.
    proxied = [_window(k, 0.4, {"etl": 500, "toxiproxy": 20 * k}, None) for k in (1, 2)]
    rss = evaluate_goals(
        proxied,
        interval_s=60,
        vacuum_hours=24,
        log_retention_s=None,
        not_judged=frozenset({"toxiproxy"}),
    )[1]
    assert rss["met"] is True and rss["not_judged"] == ["toxiproxy"]
    assert "not judged: toxiproxy" in rss["figure"]

    # Maintenance without a pass in the baseline window is named, not silently skipped.
    rss_of = [{"etl": 500}, {"etl": 500}, {"etl": 500, "maintenance": 900}]
    gap = [_window(k, 0.4, rss_of[k - 1], None) for k in (1, 2, 3)]
    rss = evaluate_goals(gap, interval_s=600, vacuum_hours=24, log_retention_s=None)[1]
    assert rss["met"] is True
    assert "not judged: maintenance (no figure in the baseline window)" in rss["figure"]

    short = steady[:2]
    goals = evaluate_goals(short, interval_s=30, vacuum_hours=24, log_retention_s=600)
    assert goals[3]["met"] is None and "not evaluated" in goals[3]["figure"]


def _pass(start_ms: float, peak: float | None) -> dict:
    table = {"files_compacted": 3, "files_vacuumed": 5}
    window = {"event": "pass", "start_ms": start_ms, "end_ms": start_ms + 2_000}
    return window | {"tables": [table], "peak_rss_mb": peak}


def test_maintenance_memory_in_a_window_is_the_peak_of_its_passes() -> None:
    events = [_pass(1_000, 300.0), _pass(5_000, 320.5), _pass(20_000, 900.0)]
    done = maintenance_in_window(events, 0, 10_000)
    assert done["passes"] == 2 and done["peak_rss_mb"] == 320.5 and done["seconds"] == 4
    assert done["files_compacted"] == 6 and done["files_vacuumed"] == 10
    sampled = {"etl": 400.0, "maintenance": 40.0}
    window = {"rss_mb": sampled, "maintenance": done}
    window["rss_peak_mb"] = {"etl": 410.0, "maintenance": 41.0}
    set_maintenance_memory(window)
    assert window["rss_mb"] == {"etl": 400.0, "maintenance": 320.5}
    assert window["rss_peak_mb"] == {"etl": 410.0, "maintenance": 320.5}
    assert sampled == {"etl": 400.0, "maintenance": 40.0}  # the monitor's record is kept
    idle = {"rss_mb": sampled, "rss_peak_mb": {"etl": 410.0, "maintenance": 41.0}}
    idle["maintenance"] = maintenance_in_window(events, 30_000, 40_000)
    set_maintenance_memory(idle)  # no pass: the scheduler alone is not the maintenance
    assert idle["maintenance"]["passes"] == 0 and idle["rss_mb"] == {"etl": 400.0}
    assert idle["rss_peak_mb"] == {"etl": 410.0}


def test_a_pass_that_dies_is_an_error_with_its_memory() -> None:
    event = run_pass(["--retention-hours", "not-a-number", "--once"])
    assert event["event"] == "error" and "exited 2 without a result" in event["error"]
    assert event["peak_rss_mb"] > 5


def test_soak_options_are_checked() -> None:
    base = {"rates": (10_000,), "warmup": 5.0, "profile": "100ms", "out": Path("x")}
    ok = BenchConfig(duration=5 + 120, soak_minutes=2, window_minutes=0.5, **base)
    assert ok.windowed and ok.windows == 4 and ok.window_s == 30 and ok.maintenance
    assert ok.vacuum_hours == 24
    for bad in (
        {"soak_minutes": 2, "window_minutes": 0.75},  # not a whole number of windows
        {"soak_minutes": 1, "window_minutes": 1},  # one window: nothing to compare
        {"soak_minutes": 2, "window_minutes": 1, "vacuum_retention_hours": 0},
        {"soak_minutes": 2, "window_minutes": 1, "idle_s": 10},
    ):
        with pytest.raises(ConfigError):
            BenchConfig(duration=5 + bad["soak_minutes"] * 60, **base, **bad)
    with pytest.raises(ConfigError):  # a soak's length is --warmup + --soak-minutes
        BenchConfig(duration=30, soak_minutes=2, window_minutes=1, **base)


def test_soak_in_windows_reports_every_window(minio: MinioServer, tmp_path: Path) -> None:
    """75 s after a 5 s warm-up at 2,000 msg/s in 15 s windows, maintenance every
    window: five windows, each with latency, CPU, memory, objects, requests and load; the
    goals beside their targets; every message accounted for; no per-message samples."""
    lake = Lake(minio_settings_for(minio, f"soak-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--warmup", "5", "--soak-minutes", "1.25"]
    args += ["--window-minutes", "0.25", "--out", str(out), "--no-local-minio", "--grace", "15"]
    args += ["--retention-s", "60"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=480)
    assert result.returncode == 0, result.stderr[-3000:]
    for word in (
        "p99 of every later window",
        "resident memory",
        "newest checkpoint of every table",
        "objects under",
        "bytes under",
        "records' retention 60 s",
    ):
        assert word in result.stdout

    report = json.loads((out / "windows.json").read_text())
    assert report["complete"] is True and report["errors"] == []
    assert report["cpu"] == cpu_model() and report["date"].endswith(" UTC")
    assert report["commit"] == source_commit()
    assert report["windows_planned"] == 5 and len(report["windows"]) == 5
    assert report["maintenance"]["interval_s"] == 15
    assert report["maintenance"]["log_retention_s"] == 600
    assert report["maintenance"]["passes"] >= 1 and report["maintenance"]["errors"] == []
    a = report["accounting"]
    assert a["messages"] == 5 * 30_000 and a["seen"] == a["messages"] and a["lost"] == 0
    assert a["warmup_messages"] == 10_000 and a["lost_during_warmup"] == 0
    for key in ("repeated_or_late", "given_up", "not_produced", "retractions"):
        assert a[key] == 0, a
    assert a["timestamp_mismatches"] == 0
    components = {"etl", "minio", "bench (consumer)", "maintenance"}
    for k, w in enumerate(report["windows"], start=1):
        assert w["window"] == k and w["complete"] is True
        assert w["start_s"] == 5 + (k - 1) * 15 and w["end_s"] == w["start_s"] + 15
        assert w["messages"] == 30_000 and w["seen"] == 30_000 and w["not_seen"] == 0
        assert w["histogram"]["count"] == w["seen"]
        assert sum(c for _, c in w["histogram"]["buckets"]) == w["seen"]
        assert 0 < w["p50_s"] <= w["p90_s"] <= w["p99_s"] <= w["p99.9_s"] <= w["max_s"]
        assert 10 <= w["wall_s"] <= 20
        cpu, rss = w["cpu_pct_of_one_core"], w["rss_mb"]
        passes = w["maintenance"]["passes"]
        assert components <= set(cpu), cpu
        assert components - ({"maintenance"} if passes == 0 else set()) <= set(rss), rss
        if passes:  # each pass a process of its own: maintenance's memory is their peak
            assert rss["maintenance"] == w["maintenance"]["peak_rss_mb"] > 50, w["maintenance"]
        assert any(n.startswith("producer ") for n in rss)
        assert cpu["etl"] > 0 and all(v > 10 for v in rss.values()), (cpu, rss)
        assert all(w["rss_peak_mb"][n] >= v for n, v in rss.items())
        assert 0 < w["machine_busy_pct_of_all_cores"] <= 100
        objects = w["objects"]
        assert objects["objects"] > 0 and objects["bytes"] > 0 and objects["log_objects"] > 0
        assert {"timezone1", "timezone2", "timezone_unified"} <= set(objects["by_table"])
        q = w["requests_per_s"]
        assert q["GET"] > 0 and q["PUT"] > 0 and q["total"] > 0
        assert q["monitor_list_requests"] >= 1
        load = w["load_average"]
        assert load["1m_mean"] is not None and len(load["at_end"]) == 3
        assert set(w["maintenance"]) >= {"passes", "seconds", "files_compacted"}
    assert sum(w["maintenance"]["passes"] for w in report["windows"]) >= 1
    assert report["windows"][-1]["objects"]["by_table"]["timezone1"]["checkpoint_bytes"] > 0
    goals = report["goals"]
    assert len(goals) == 5 and all(g["met"] in (True, False, None) for g in goals)
    assert all(g["figure"] and g["target"] for g in goals)
    assert goals[2]["met"] is not None  # checkpoints are compared from window 2 on
    assert goals[3]["met"] is None  # 24 h vacuum retention: not in force within a minute
    # --retention-s 60 dropped the first records from every table.
    run_lake = Lake(lake.settings.with_prefix(report["lake_prefix"]))
    for table in ("timezone1", "timezone2", "timezone_unified"):
        assert oldest_version(run_lake, table) > 0, table

    md = (out / "windows.md").read_text()
    assert "## Goals" in md and "## CPU per component" in md and "## Resident memory" in md
    assert md.count("\n| 5 ") == 4  # window 5 in the latency, CPU, memory, checkpoint tables
    png = out / "windows.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == PNG_MAGIC
    # Saved among the long runs, it is a section of the results page.
    long_runs = tmp_path / "long-runs"
    long_runs.mkdir()
    (long_runs / "soak-75s.json").write_text(json.dumps(report | {"commit": "1a2b3c4"}))
    (long_runs / "soak-75s.md").write_text("Why p99 moved.\n")
    page = "\n".join(long_runs_markdown(find_long_runs(long_runs)))
    assert "### soak-75s\n" in page and "commit 1a2b3c4" in page and "#### Goals" in page
    assert page.endswith("#### Reading\n\nWhy p99 moved.")
    assert page.count("\n| 5 ") == 4 and "windows.png" not in page
    # No per-message analysis: no samples table, no report.md.
    assert not (out / "report.md").exists()
    assert not Lake(lake.settings.with_prefix(report["lake_prefix"])).exists(SAMPLES_TABLE)
