"""`deltabus bench --serve postgres|opensearch`: the serving stage in a short real run.

A throwaway PostgreSQL or OpenSearch node, the sink as its own process, every message
accounted for in the store; speed is not asserted (shared 2-core machines), consistency
is. The option checks and the OpenSearch reader's counting run without a store.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.adapters.serving.opensearch_target import DEFAULT_REFRESH_INTERVAL_MS
from deltabus.core.errors import ConfigError
from deltabus.delta.lake import Lake
from deltabus_bench.config import BenchConfig
from deltabus_bench.report import console_text, report_json, serving_markdown
from deltabus_bench.results import RunSummary
from deltabus_bench.serving import unserved_is_loss
from deltabus_bench.serving_opensearch import OpenSearchReader
from tests.conftest import lake_env, minio_settings_for, run_cli
from tests.opensearch_fixture import IN_CI, require_opensearch_jars
from tests.pg_fixture import require_postgres_binaries

STORE_VARS = ("DELTABUS_POSTGRES_DSN", "DELTABUS_OPENSEARCH_URL")


def _bench(minio: MinioServer, tmp_path: Path, backend: str) -> tuple[str, dict, Path]:
    """A 5 s run at 2000 msg/s with `--serve backend --serve-replay`: its stdout,
    report.json and --out."""
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "5", "--warmup", "1", "--serve", backend]
    args += ["--serve-replay", "--out", str(out), "--no-local-minio", "--grace", "15"]
    args += ["--no-progress"]
    env = {k: v for k, v in lake_env(lake).items() if k not in STORE_VARS}
    result = run_cli(args, env, tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads((out / "report.json").read_text()), out


def _check_serving(report: dict, out: Path, backend: str, server: str) -> dict:
    """The checks both backends share; the run's `serving` figures."""
    (run,) = report["runs"]
    serving = run["serving"]
    assert serving["backend"] == backend
    assert serving["samples"] == run["samples"] == 8000  # every message after the warm-up
    assert serving["not_served"] == 0
    stage, e2e = serving[f"unified_commit_to_{backend}"], serving[f"sent_to_{backend}"]
    assert 0 < stage["p50"] <= stage["p99"] <= stage["max"], stage
    assert e2e["p50"] > stage["p50"]  # the serving stage is one part of sent -> served
    assert serving["verdict"] in ("keeping up", "over bound", "behind")
    assert set(serving["cpu_pct_of_one_core"]) == {"serve sink", server}
    assert all(v > 0 for v in serving["cpu_pct_of_one_core"].values())
    assert {"serve sink", server} <= set(run["cost"]["cpu_s_per_million_msgs"])
    assert f"{backend} serving" in report["highest_keeping_up_rate"]
    assert "Serving stage" in (out / "report.md").read_text()
    replay = serving["replay"]  # the sink alone loaded the whole table into a fresh target
    assert replay["rows"] == 10_000 and replay["rows_per_s"] > 0, replay
    assert replay["sink_cpu_s"] > 0 and replay["server_cpu_s"] > 0, replay
    assert replay["target"].endswith("_replay")
    assert "standalone" in (out / "report.md").read_text()
    return serving


def test_bench_serve_postgres(minio: MinioServer, tmp_path: Path) -> None:
    require_postgres_binaries()
    stdout, report, out = _bench(minio, tmp_path, "postgres")
    assert "unified commit→PostgreSQL" in stdout
    serving = _check_serving(report, out, "postgres", "postgresql")
    assert "unified_commit_to_postgres" in serving and "sent_to_postgres" in serving
    sink = serving["sink_report"]
    assert sink["served_rows"] == 10_000 and sink["rows_deleted"] == 0


def test_bench_serve_opensearch(minio: MinioServer, tmp_path: Path) -> None:
    if shutil.which("java") is None:
        if IN_CI:
            pytest.fail("OpenSearch is required in CI: java is not installed")
        pytest.skip("java is not installed: no OpenSearch node can be started")
    require_opensearch_jars()
    stdout, report, out = _bench(minio, tmp_path, "opensearch")
    assert "unified commit→OpenSearch" in stdout and "--serve opensearch" in stdout
    serving = _check_serving(report, out, "opensearch", "opensearch")
    assert serving["refresh_interval_ms"] == DEFAULT_REFRESH_INTERVAL_MS
    assert serving["in_flight"] == 4
    raw = serving["raw_capacity"]  # the node alone, before the run
    assert raw["docs"] > 0 and raw["docs_per_s"] > 0 and raw["docs_per_request"] == 1000
    assert raw["node_cpu_s_per_million_docs"] > 0  # the node's own CPU per document
    assert "CPU-s per million in the node" in stdout
    assert "The node alone before each run" in stdout
    sink = serving["sink_report"]
    assert sink["docs_indexed"] == sink["indexed_docs"] == 10_000, sink
    assert sink["docs_deleted"] == 0


def test_serve_options_are_checked(tmp_path: Path) -> None:
    base: dict[str, Any] = {"rates": (1000,), "duration": 5.0, "warmup": 1.0}
    base |= {"profile": "100ms", "out": tmp_path}
    assert BenchConfig(serve="opensearch", serve_refresh_ms=200, **base).serve_refresh_ms == 200
    with pytest.raises(ConfigError, match="postgres, opensearch"):
        BenchConfig(serve="mysql", **base)
    for bad in ({"serve": "postgres", "serve_refresh_ms": 200}, {"serve_refresh_ms": 200}):
        with pytest.raises(ConfigError, match="--serve-refresh-ms"):
            BenchConfig(**base, **bad)
    with pytest.raises(ConfigError, match="1..60000"):
        BenchConfig(serve="opensearch", serve_refresh_ms=0, **base)
    with pytest.raises(ConfigError, match="--serve-replay"):
        BenchConfig(serve_replay=True, **base)


def test_unknown_serve_backend_is_refused_before_a_run(tmp_path: Path) -> None:
    args = ["bench", "--rates", "1000", "--duration", "5", "--warmup", "1", "--serve", "mysql"]
    result = run_cli([*args, "--out", str(tmp_path / "out")], {}, tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "postgres, opensearch" in result.stderr
    assert not (tmp_path / "out").exists()


def _run(backend: str, keys: dict[str, Any]) -> dict[str, Any]:
    stage = {"p50": 0.5, "p99": 0.9, "p99.9": 1.0, "max": 1.1}
    serving = {"samples": 10, "not_served": 0, "verdict": "keeping up", **keys}
    serving |= {f"unified_commit_to_{backend}": stage, f"sent_to_{backend}": stage}
    serving["cpu_pct_of_one_core"] = {"serve sink": 5.0}
    return {"backbone": "delta", "rate": 2000, "verdict": "keeping up", "serving": serving}


def test_serving_report_names_the_backend() -> None:
    opensearch = _run("opensearch", {"backend": "opensearch", "refresh_interval_ms": 500})
    text = "\n".join(serving_markdown([RunSummary.model_validate(opensearch)]))
    assert "`--serve opensearch`" in text and "unified commit→OpenSearch" in text
    assert "500 ms" in text
    # A run reported before the OpenSearch stage existed has no "backend": postgres.
    old = "\n".join(serving_markdown([RunSummary.model_validate(_run("postgres", {}))]))
    assert "unified commit→PostgreSQL" in old
    keys = {"samples", "messages", "lost", "stages", "cost", "max_lag_s", "achieved_rate"}
    keys |= {"p50", "p75", "p85", "p95", "p99", "p99.9", "max", "fell_behind"}
    run = opensearch | dict.fromkeys(keys)
    report = report_json("100ms", "m", "c", [RunSummary.model_validate(run)])
    assert report["highest_keeping_up_rate"]["opensearch serving"] == 2000
    assert "postgres serving" not in report["highest_keeping_up_rate"]


def test_the_console_is_rendered_from_the_runs_not_from_report_md() -> None:
    run = _run("postgres", {"backend": "postgres"})
    run["serving"]["replay"] = {
        "rows": 80_000,
        "elapsed_s": 2.0,
        "rows_per_s": 40_000,
        "sink_cpu_s": 1.5,
        "server_cpu_s": 1.0,
    }
    run |= {"p50": 0.2, "p99": 0.4, "etl": "pathway"}
    run["cost"] = {"cpu_cores_total": 0.5, "cpu_s_per_million_msgs_total": 40.0}
    text = console_text(
        "100ms", "2 cores (CPU)", "deltabus bench", [RunSummary.model_validate(run)]
    )
    lines = text.splitlines()
    assert lines[0] == "# deltabus latency benchmark" and "- machine: 2 cores (CPU)" in lines
    assert any(line.startswith("| 2,000 | 0.20 / 0.40") for line in lines), text
    assert "## Cost per message" in text and "| delta | 2,000 | 0.5 | 40.0" in text
    assert "unified commit→PostgreSQL" in text
    assert "| 2,000 | 80,000 | 2.0 | 40,000 | 1.5 / 1.0 |" in text  # the sink alone
    assert "## All percentiles" not in text  # report.md only


class FakeIndex:
    """The requests the reader makes: the sink's position (a get), the number of
    documents per version in a range (a terms aggregation), and, once the run is over,
    every document's message and version (a scroll)."""

    def __init__(self, docs: list[tuple[int, str]], position: int) -> None:
        self.docs, self.position = docs, position
        self.searches = 0
        self.cleared: list[str] = []

    def get(self, index: str, id: str) -> dict:
        return {"found": True, "_source": {"version": self.position}}

    def search(self, index: str, body: dict, scroll: str | None = None) -> dict:
        if scroll is not None:
            return self._page(0, body["size"])
        self.searches += 1
        bounds = body["query"]["range"]["version"]
        versions = [v for v, _ in self.docs if bounds["gt"] < v <= bounds["lte"]]
        buckets = [{"key": v, "doc_count": versions.count(v)} for v in sorted(set(versions))]
        return {"aggregations": {"v": {"buckets": buckets}}}

    def _page(self, start: int, size: int) -> dict:
        hits = [
            {"fields": {"message": [m], "version": [v]}} for v, m in self.docs[start : start + size]
        ]
        return {"_scroll_id": f"{start + size}:{size}", "hits": {"hits": hits}}

    def scroll(self, scroll_id: str, scroll: str) -> dict:
        start, size = map(int, scroll_id.split(":"))
        return self._page(start, size)

    def clear_scroll(self, scroll_id: str) -> None:
        self.cleared.append(scroll_id)

    def close(self) -> None:
        pass


def test_opensearch_reader_stamps_versions_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message is served at the first poll whose position covers its version, when all
    of that version's documents were searchable then; never when some were missing."""
    monkeypatch.setattr("deltabus_bench.serving_opensearch.PAGE", 2)  # several pages
    reader = OpenSearchReader("http://127.0.0.1:9201", "served", 0.01)
    # Versions 1-2 are acknowledged (position 2); version 3 is searchable already.
    index = FakeIndex([(1, "a"), (1, "b"), (2, "c"), (3, "d"), (3, "e")], position=2)
    reader.client = index
    assert reader.poll() == ([], 3)  # up to the position only
    index.docs.append((3, "f"))  # the rest of version 3, then its position
    assert reader.poll() == ([], 0) and index.searches == 1  # no move: no search
    index.position = 4  # version 4 is acknowledged before its document is searchable
    assert reader.poll() == ([], 3)
    index.docs.append((4, "g"))
    reader.finish()
    assert index.cleared  # the scroll context is released
    served = {m: t for m, t in zip(*reader.table().to_pydict().values(), strict=True)}
    assert set(served) == {"a", "b", "c", "d", "e", "f"}  # g: not all of version 4 counted
    assert served["a"] == served["c"] < served["d"] == served["f"]


class FakeCluster:
    """Records what the run removes from a configured cluster."""

    def __init__(self) -> None:
        self.removed: list[tuple[str, str | None]] = []
        self.indices = self

    def delete(self, index: str, id: str | None = None, **params: Any) -> None:
        self.removed.append((index, id))

    def close(self) -> None:
        pass


def test_configured_opensearch_gets_an_index_of_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pydantic import SecretStr

    from deltabus_bench.delta.driver import serving_run

    url = "http://bench:s3cret@127.0.0.1:9201"
    settings = SimpleNamespace(opensearch_url=SecretStr(url), postgres_dsn=None)
    runs = [serving_run("opensearch", settings, tmp_path, "t", 0.02, 250) for _ in range(2)]
    first, second = runs
    assert first.index.startswith("served_bench_") and first.index != second.index
    options = first._sink_options(first.target)
    assert options == ["--index", first.index, "--refresh-interval-ms", "250", "--in-flight", "4"]
    assert first._sink_env() == {"DELTABUS_OPENSEARCH_URL": url}  # the child's only
    assert "s3cret" not in first.redact(f"failed at {url}: s3cret")
    cluster = FakeCluster()
    monkeypatch.setattr("deltabus.adapters.serving.opensearch_connection.client", lambda _: cluster)
    first.stop()  # nothing started: only this run's index and position are removed
    replay = f"{first.index}_replay"  # --serve-replay's index, when it ran
    assert cluster.removed == [
        (first.index, None),
        ("deltabus_sink_position", first.index),
        (replay, None),
        ("deltabus_sink_position", replay),
    ]


def test_messages_a_sink_is_still_behind_are_a_backlog_not_a_loss() -> None:
    """Unserved messages fail a run only when the sink had applied every version it knew
    of, or left no report."""
    assert not unserved_is_loss({"version": 41, "unified_version": 57})
    assert unserved_is_loss({"version": 57, "unified_version": 57})
    assert unserved_is_loss(None)
