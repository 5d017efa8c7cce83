"""`deltabus bench --serve postgres`: the serving stage in a short real run.

A throwaway PostgreSQL, the sink as its own process, every message accounted for in
PostgreSQL; speed is not asserted (shared 2-core machines), consistency is.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from deltabus.lake import Lake
from deltabus.local_minio import MinioServer
from tests.conftest import lake_env, minio_settings_for, run_cli
from tests.pg_fixture import require_postgres_binaries


def test_bench_serve_postgres(minio: MinioServer, tmp_path: Path) -> None:
    require_postgres_binaries()
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "5", "--warmup", "1", "--serve", "postgres"]
    args += ["--out", str(out), "--no-local-minio", "--grace", "15", "--no-progress"]
    env = {k: v for k, v in lake_env(lake).items() if k != "DELTABUS_POSTGRES_DSN"}
    result = run_cli(args, env, tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "unified commit→PostgreSQL" in result.stdout

    report = json.loads((out / "report.json").read_text())
    (run,) = report["runs"]
    serving = run["serving"]
    assert serving["samples"] == run["samples"] == 8000  # every message after the warm-up
    assert serving["not_served"] == 0
    stage, e2e = serving["unified_commit_to_postgres"], serving["sent_to_postgres"]
    assert 0 < stage["p50"] <= stage["p99"] <= stage["max"], stage
    assert e2e["p50"] > stage["p50"]  # the serving stage is one part of sent -> PostgreSQL
    assert serving["verdict"] in ("keeping up", "over bound", "behind")
    assert set(serving["cpu_pct_of_one_core"]) == {"serve sink", "postgresql"}
    assert all(v > 0 for v in serving["cpu_pct_of_one_core"].values())
    assert {"serve sink", "postgresql"} <= set(run["cost"]["cpu_s_per_million_msgs"])
    sink = serving["sink_report"]
    assert sink["served_rows"] == 10_000 and sink["rows_deleted"] == 0
    assert "postgres serving" in report["highest_keeping_up_rate"]
    assert "Serving stage" in (out / "report.md").read_text()
