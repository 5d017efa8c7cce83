"""The benchmark asset: `deltabus bench` as a subprocess on MinIO, its report as metadata."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from deltabus.delta.lake import Lake
from tests.conftest import use_lake_env


def test_benchmark_report_materializes_with_percentiles_and_plots(
    minio_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from assets.benchmark.assets import benchmark_report
    from resources import default_resources

    use_lake_env(monkeypatch, minio_lake)
    config = {"rates": "2000", "duration_s": 3, "warmup_s": 1, "out_dir": str(tmp_path)}
    result = materialize(
        [benchmark_report],
        resources=default_resources(),
        run_config={"ops": {"benchmark_report": {"config": config}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    (mat,) = result.asset_materializations_for_node("benchmark_report")
    md = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    # rate, samples after the 1 s warm-up (one more or less at the edge)
    assert re.search(r"\| 2000 \| (3999|4000|4001) \|", md["results"]), md["results"]
    assert 0 < md["p99_at_2000"] < 30
    # The verdict and the highest sustainable rate agree (a busy machine may be over bound).
    kept_up = md["not_keeping_up_at"] == "none"
    assert kept_up == ("'delta': 2000" in md["highest_keeping_up_rate"]), md
    assert kept_up or md["not_keeping_up_at"] in ("2000 (over bound)", "2000 (behind)")
    assert "input_commit_to_etl" in md["stages"]
    assert "data:image/png;base64," in md["plots"]
    assert Path(md["report"]).is_file()
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "bench_passed" and check.passed
