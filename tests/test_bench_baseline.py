"""`python -m deltabus_bench.baseline`: one page from reports of one date, commit and CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deltabus_bench.baseline import BaselineError, baseline_markdown, find_reports

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
