"""`python -m deltabus_bench.baseline`: one page from reports of one date, commit and CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deltabus_bench.baseline import BaselineError, baseline_markdown, find_long_runs, find_reports

RUN = {
    "rate": 10000,
    "backbone": "delta",
    "etl": "pathway",
    "lost": 0,
    "p50": 0.123,
    "p99": 0.456,
    "verdict": "keeping up",
    "cost": {"cpu_s_per_million_msgs_total": 49.6, "requests_per_million_msgs": 12976.0},
}


def report(folder: Path, **fields: object) -> Path:
    body = {
        "date": "2026-11-28 18:40 UTC",
        "commit": "1a2b3c4",
        "cpu": "Intel(R) Xeon(R) Processor",
        "profile": "100ms",
        "store": {"profile": "loopback", "summary": "MinIO on loopback"},
        "machine": "2 cores (Intel(R) Xeon(R) Processor)",
        "command": "deltabus bench --rates 10000",
        "runs": [RUN],
        "highest_keeping_up_rate": {"delta": 10000},
    } | fields
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(body))
    return folder


def test_reports_of_one_run_make_one_page(tmp_path: Path) -> None:
    report(tmp_path / "out" / "100ms")
    report(tmp_path / "out" / "store-s3-standard", store={"profile": "s3-standard"})
    page = baseline_markdown(find_reports([tmp_path / "out"]))
    assert "One baseline: 2026-11-28, commit 1a2b3c4, Intel(R) Xeon(R) Processor." in page
    assert page.count("| delta | pathway | 10,000 | 0.12 | 0.46 | keeping up | 49.6 |") == 2
    assert "## 100ms" in page and "## store-s3-standard" in page
    assert "Highest rate keeping up: delta 10,000." in page
    first = "| 100ms | delta | loopback | 100ms | 10,000 | 0.12 / 0.46 |"
    assert f"{first} 10,000 (the highest tried) |" in page
    row = "| store-s3-standard | delta | s3-standard | 100ms | 10,000 | 0.12 / 0.46 |"
    assert f"{row} 10,000 (the highest tried) |" in page


def test_reports_are_in_name_order_with_numbers_by_value(tmp_path: Path) -> None:
    for name in ("idle-30m", "idle", "sweep-1000ms", "idle-5m", "sweep-100ms"):
        report(tmp_path / "out" / name)
    names = [r.name for r in find_reports([tmp_path / "out"])]
    assert names == ["idle", "idle-5m", "idle-30m", "sweep-100ms", "sweep-1000ms"]


def test_serving_stages_and_idle_cost_have_their_lines(tmp_path: Path) -> None:
    serving = {
        "backend": "opensearch",
        "not_served": 0,
        "verdict": "keeping up",
        "unified_commit_to_opensearch": {"p50": 0.506, "p99": 1.365},
        "sent_to_opensearch": {"p50": 0.961, "p99": 1.737},
        "replay": {"rows_per_s": 23020},
    }
    idle = {
        "seconds": 60,
        "cpu_pct_of_one_core": {"etl": 1.5, "minio": 2.0, "machine": 9.0},
        "requests_per_s": {"total": 4.2},
        "first_after_idle_s": 0.31,
    }
    runs = [
        RUN | {"serving": serving},
        RUN | {"rate": 20000, "cost": RUN["cost"] | {"idle": idle}},
    ]
    report(tmp_path / "serve", runs=runs, highest_keeping_up_rate={"delta": None})
    page = baseline_markdown(find_reports([tmp_path / "serve"]))
    assert "| serve | delta | loopback | 100ms | 10,000 | 0.12 / 0.46 | none |" in page
    assert "| opensearch | 10,000 | 0.51 / 1.36 | 1.74 | keeping up | 0 | 23,020 |" in page
    assert "Idle after the 20,000 msg/s run (60 s without traffic): 3.5 % of one core" in page
    assert "4.2 requests/s; the first messages after it: 0.31 s." in page


@pytest.mark.parametrize(
    "odd",
    [
        {"commit": "9f8e7d6"},
        {"date": "2026-11-27 09:00 UTC"},
        {"cpu": "AMD EPYC"},
        {"commit": "1a2b3c4+dirty"},
        {"commit": None},
    ],
)
def test_mixed_or_unknown_provenance_is_refused(tmp_path: Path, odd: dict) -> None:
    report(tmp_path / "a")
    report(tmp_path / "b", **odd)
    with pytest.raises(BaselineError, match="one date, one clean commit and one CPU model"):
        baseline_markdown(find_reports([tmp_path / "a", tmp_path / "b"]))


def test_command_line_exits_2_with_one_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "deltabus_bench.baseline", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"baseline: error: no report.json under {tmp_path}"
    report(tmp_path / "run")
    out = tmp_path / "results.md"
    written = subprocess.run(
        [sys.executable, "-m", "deltabus_bench.baseline", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert written.returncode == 0, written.stderr
    assert out.read_text().startswith("# Benchmark results\n")


def test_each_backbone_of_a_side_by_side_run_has_its_summary_row(tmp_path: Path) -> None:
    runs = [RUN, RUN | {"backbone": "kafka", "p50": 0.05, "p99": 0.09}]
    report(tmp_path / "sweep", runs=runs, highest_keeping_up_rate={"delta": 10000, "kafka": None})
    page = baseline_markdown(find_reports([tmp_path / "sweep"]))
    assert "| sweep | delta | loopback | 100ms | 10,000 | 0.12 / 0.46 | 10,000 (the highest" in page
    assert "| sweep | kafka | loopback | 100ms | 10,000 | 0.05 / 0.09 | none |" in page


def test_goals_stand_beside_their_figures(tmp_path: Path) -> None:
    """Met, missed (with its reason) and not measured, from the reports alone."""
    report(
        tmp_path / "out" / "store-s3-standard",
        store={"profile": "s3-standard"},
        runs=[RUN | {"p50": 0.30, "p99": 0.44}, RUN | {"rate": 250000}],
        highest_keeping_up_rate={"delta": 250000},
    )
    report(
        tmp_path / "out" / "store-s3-express",
        store={"profile": "s3-express"},
        runs=[RUN | {"p50": 0.14, "p99": None}],
        highest_keeping_up_rate={"delta": 250000},
    )
    raw = {"docs_per_s": 20000.0}
    serving = {"backend": "opensearch", "raw_capacity": raw}
    report(
        tmp_path / "out" / "serve-opensearch",
        runs=[
            RUN | {"serving": serving | {"unified_commit_to_opensearch": {"p99": 0.8}}},
            RUN | {"rate": 20000, "serving": serving},
        ],
        highest_keeping_up_rate={"delta": 20000, "opensearch serving": 10000},
    )
    page = baseline_markdown(find_reports([tmp_path / "out"]))
    goals = page[page.index("## Goals") :]
    assert (
        "| s3-standard, 10,000 msg/s: p50 / p99 (ahead of Bufstream 0.26 / 0.50 s on S3 "
        "Standard) | 0.30 s / 0.44 s | ≤ 0.22 / 0.45 s | **missed**: [round trips per hop]"
    ) in goals
    assert (
        "| s3-standard: highest rate keeping up | 250,000 msg/s | ≥ 250,000 msg/s | met |" in goals
    )
    assert "| 0.14 s / — | ≤ 0.15 / 0.25 s | not measured |" in goals
    assert (
        "| s3-express: highest rate keeping up | 250,000 msg/s | ≥ 400,000 msg/s | **missed**"
        in goals
    )
    assert "| 10,000 msg/s (50%) | ≥ 80% (16,000 msg/s) | **missed**" in goals
    assert (
        "searchable p99 at 10,000 msg/s (at most half the node's rate) | 0.80 s | ≤ 1 s | met |"
        in goals
    )
    # The serving runs on loopback are not judged against the plain-run anchors.
    assert "Pathway's published" not in goals


def test_plain_loopback_runs_are_judged_against_the_anchors(tmp_path: Path) -> None:
    report(tmp_path / "sweep", runs=[RUN, RUN | {"rate": 30000, "p50": 0.3, "p99": 0.5}])
    page = baseline_markdown(find_reports([tmp_path / "sweep"]))
    assert (
        "10,000 msg/s: below Pathway's published Delta-on-MinIO p50 / p99 | 0.12 s / 0.46 s "
        "| < 0.26 / 0.67 s | met |" in page
    )
    assert "| 0.30 s / 0.50 s | < 0.28 / 0.64 s | **missed** |" in page


def test_a_missed_serving_goal_says_what_the_rate_would_take_of_the_cores() -> None:
    """The node at its CPU per document alone (the median of the runs'), the rest at its
    CPU per message in the highest-rate run, at 80 % of the node's own rate."""
    from deltabus_bench.goals import serving_cpu_budget

    def run(rate: int, node_cpu: float, per_msg: dict[str, float]) -> dict:
        raw = {"docs_per_s": 50000.0, "node_cpu_s_per_million_docs": node_cpu}
        serving = {"backend": "opensearch", "raw_capacity": raw}
        return {"rate": rate, "serving": serving, "cost": {"cpu_s_per_million_msgs": per_msg}}

    runs = [
        run(10000, 30.0, {"etl": 9.0, "opensearch": 40.0, "serve sink": 20.0}),
        run(50000, 35.0, {"etl": 4.0, "opensearch": 30.0, "serve sink": 16.0}),
        run(20000, 40.0, {"etl": 6.0, "opensearch": 35.0, "serve sink": 18.0}),
    ]
    said = serving_cpu_budget(runs, 40000.0, "2 cores (AMD EPYC), 24 GiB RAM")
    # node: 35 CPU-s per million x 40,000/s = 1.4 cores; the rest: (4 + 16) x 40,000/s = 0.8
    assert (
        said
        == ": at 40,000 msg/s the node alone would take 1.4 cores and the rest at least 0.8, of 2"
    )
    runs[1]["serving"]["raw_capacity"].pop("node_cpu_s_per_million_docs")
    budget = serving_cpu_budget(runs, 40000.0, "2 cores (AMD EPYC)")
    assert "1.6 cores" in budget  # the upper median of 30 and 40, as for the raw rate
    assert serving_cpu_budget(runs, 40000.0, "a machine") == ""  # no core count: nothing said


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"complete": False}, "is not a finished soak's windows.json"),
        ({"mode": "sweep"}, "is not a finished soak's windows.json"),
        ({"commit": None}, "does not name its date, clean commit and CPU model"),
        ({"commit": "1a2b3c4+dirty"}, "does not name its date, clean commit and CPU model"),
        ({"cpu": ""}, "does not name its date, clean commit and CPU model"),
    ],
)
def test_a_long_run_without_its_provenance_is_refused(
    tmp_path: Path, fields: dict[str, object], why: str
) -> None:
    soak = {
        "mode": "soak in windows",
        "complete": True,
        "date": "2026-11-29 11:58 UTC",
        "commit": "1a2b3c4",
        "cpu": "AMD EPYC",
    } | fields
    (tmp_path / "soak-2h.json").write_text(json.dumps(soak))
    with pytest.raises(BaselineError, match=why):
        find_long_runs(tmp_path)


def test_a_missing_long_runs_folder_is_named(tmp_path: Path) -> None:
    report(tmp_path / "out")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltabus_bench.baseline",
            str(tmp_path / "out"),
            "--long-runs",
            str(tmp_path / "nowhere"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"baseline: error: no folder {tmp_path / 'nowhere'} for the long runs"
    )
