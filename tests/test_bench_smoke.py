"""`deltabus bench` end to end on the real MinIO fixture: a short run, a complete report.

Speed is not asserted (shared 2-core machines); consistency is: every message produced
after the warm-up is a sample, nothing is lost, percentiles are ordered, the samples are
stored as a Delta table and the plots are real PNGs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.latency import percentiles
from deltabus.apps.timezones.layout import TimezoneLayout, read_layout
from deltabus.core.errors import ConfigError
from deltabus.delta.lake import Lake
from deltabus_bench.analysis import SAMPLES_TABLE, recovery
from deltabus_bench.config import (
    BenchConfig,
    parse_backbones,
    parse_profile,
    parse_rates,
)
from deltabus_bench.report import RUN_KEYS
from tests.conftest import (
    IN_CI,
    kafka_ready,
    lake_env,
    minio_settings_for,
    require_kafka,
    run_cli,
)

pytestmark = [pytest.mark.integration]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ORDER = ("p50", "p75", "p85", "p95", "p99", "p99.9", "max")
STAGES = ("sent_to_input_commit", "input_commit_to_etl", "etl_to_unified_commit")


def check_report(
    out: Path, backbones: tuple[str, ...], rate: int, messages: int, store: str = "loopback"
) -> dict:
    report = json.loads((out / "report.json").read_text())
    keys = {"profile", "store", "machine", "command", "runs", "highest_keeping_up_rate"}
    assert set(report) == keys | {"date", "commit", "cpu"}
    assert report["cpu"] in report["machine"] and report["date"].endswith(" UTC")
    assert report["commit"] is None or len(report["commit"].split("+")[0]) >= 7
    assert report["profile"] == "100ms"
    assert report["store"]["profile"] == store
    assert "cores" in report["machine"] and report["command"].startswith("deltabus bench")
    assert [r["backbone"] for r in report["runs"]] == list(backbones)
    for run in report["runs"]:
        assert tuple(run) == RUN_KEYS
        assert run["rate"] == rate
        assert run["messages"] == messages, run
        assert run["samples"] == run["messages"], run  # every message after warm-up
        assert run["lost"] == 0, run
        values = [run[k] for k in ORDER]
        assert all(isinstance(v, float) and v > 0 for v in values), values
        assert values == sorted(values), f"percentiles out of order: {values}"
        assert run["achieved_rate"] > 0
        assert run["max_lag_s"] >= 0
        assert run["verdict"] in ("keeping up", "over bound", "behind")
        assert run["fell_behind"] == (run["verdict"] == "behind")
        if run["verdict"] == "keeping up":
            assert report["highest_keeping_up_rate"][run["backbone"]] == rate
        cost = run["cost"]
        assert cost["cpu_s_per_million_msgs"]["etl"] > 0, cost
        machine = cost["machine"]  # busy, stolen, waiting for I/O: % of all cores
        assert 0 < machine["busy_pct_of_all_cores"] <= 100, machine
        assert 0 <= machine["steal_pct_of_all_cores"] <= machine["busy_pct_of_all_cores"]
        for kind in ("steal", "iowait"):
            assert 0 <= machine[f"{kind}_pct_of_all_cores"] <= 100, machine
            assert machine[f"{kind}_pct_of_all_cores"] <= machine[f"{kind}_worst_second_pct"] + 1
        if run["backbone"] == "delta":  # MinIO's own request counters, by billing class
            assert cost["requests_per_s"]["GET"] > 0 and cost["requests_per_s"]["PUT"] > 0, cost
            assert cost["request_cost_usd_per_day"] > 0
        assert set(run["stages"]) == {*STAGES, "unified_commit_to_seen"}
        for stage in run["stages"].values():
            assert stage["p50"] is not None and stage["p99"] is not None
            assert stage["p50"] <= stage["p99"] + 1e-9
        # The cumulative stage p50s end at the end-to-end p50.
        assert run["stages"]["unified_commit_to_seen"]["p50_since_sent"] == pytest.approx(
            run["p50"], abs=1e-3
        )
        png = out / f"latency-{run['backbone']}-{rate}.png"
        assert png.stat().st_size > 1000 and png.read_bytes()[:8] == PNG_MAGIC
    png = out / "percentiles-vs-rate.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == PNG_MAGIC
    md = (out / "report.md").read_text()
    assert "| rate msg/s |" in md and "anchor commit 100ms p50 / p99 (s)" in md
    assert f"- store: {store} (" in md or f"- store: **{store}**, " in md
    assert "Where the time goes" in md
    return report


def test_bench_smoke_delta(minio: MinioServer, tmp_path: Path) -> None:
    """2000 msg/s for 4 s with 1 s warm-up: 6000 samples, a full report, stored samples."""
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "4", "--warmup", "1"]
    args += ["--profile", "100ms", "--out", str(out), "--no-local-minio", "--grace", "15"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| 2,000 |" in result.stdout
    check_report(out, ("delta",), 2000, 6000)

    # The samples are a Delta table under the run's prefix; DuckDB's percentiles over it
    # (the Dagster asset's SQL) are the report's.
    detail = json.loads((out / "runs" / "delta-2000.json").read_text())
    assert detail["errors"] == [] and detail["checks"]["produced_rows"] == 8000
    run_lake = Lake(lake.settings.with_prefix(detail["lake_prefix"]))
    assert run_lake.exists(SAMPLES_TABLE)
    samples = run_lake.open(SAMPLES_TABLE).to_pyarrow_table()
    assert samples.num_rows == 8000  # warm-up included; the SQL drops it
    assert samples.column_names == [
        "message",
        "sent_ms",
        "input_commit_ms",
        "etl_processed_ms",
        "unified_commit_ms",
        "seen_ms",
        "latency_ms",
    ]
    con = duckdb.connect()
    con.register("latency_samples", samples)
    pct = percentiles(con, "latency_samples", warmup_s=1)
    assert pct["samples"] == 6000
    assert pct["p99"] == pytest.approx(detail["p99"], abs=1e-3)
    # Stage timestamps are in order for every sample.
    bad = con.execute(
        """SELECT count(*) FROM latency_samples WHERE NOT (sent_ms <= input_commit_ms + 1
           AND input_commit_ms <= etl_processed_ms + 1 AND etl_processed_ms <= unified_commit_ms
           + 1 AND unified_commit_ms <= seen_ms + 1)"""
    ).fetchall()[0][0]
    assert bad == 0


def test_bench_smoke_store_profile(minio: MinioServer, toxiproxy: Path, tmp_path: Path) -> None:
    """`--store s3-express`: every component reaches MinIO through toxiproxy, nothing is
    lost, MinIO's request counters (read directly) still count, and the reports name the
    store profile."""
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    env = {**lake_env(lake), "DELTABUS_TOXIPROXY_BIN": str(toxiproxy)}
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "4", "--warmup", "1", "--grace", "15"]
    args += ["--profile", "100ms", "--out", str(out), "--no-local-minio", "--store", "s3-express"]
    result = run_cli(args, env, tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "- store: **s3-express**" in result.stdout
    report = check_report(out, ("delta",), 2000, 6000, store="s3-express")
    assert report["store"]["toxiproxy"] and "tail" not in report["store"]
    detail = json.loads((out / "runs" / "delta-2000.json").read_text())
    assert detail["errors"] == [] and detail["store"] == "s3-express"
    assert list((out / "logs").glob("toxiproxy-*.log"))  # the proxy ran for this benchmark


def test_notify_is_on_where_the_store_pushes_commit_events() -> None:
    """Pushed commit events by default for a throwaway MinIO on loopback only; an explicit
    --notify/--no-notify wins."""
    from deltabus_bench.session import notify_for

    def config(**kwargs: object) -> BenchConfig:
        return BenchConfig(
            rates=(1000,), duration=1, warmup=0, profile="100ms", out=Path("o"), **kwargs
        )

    assert notify_for(config(), local_minio=True)
    assert not notify_for(config(store="s3-standard"), local_minio=True)
    assert not notify_for(config(), local_minio=False)
    assert not notify_for(config(notify=False), local_minio=True)
    assert notify_for(config(notify=True, store="s3-express"), local_minio=True)


def test_bench_smoke_notify(minio: MinioServer, tmp_path: Path) -> None:
    """`--local-minio` without --notify: its own MinIO posts every commit to a relay
    process that wakes the tails; every message arrives, the relay's CPU is a component,
    and the idle window's first messages are measured."""
    env = {
        **lake_env(Lake(minio_settings_for(minio, "unused"))),
        "DELTABUS_MINIO_BIN": str(minio.binary),
    }
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "4", "--warmup", "1", "--idle-s", "3"]
    args += ["--profile", "100ms", "--out", str(out), "--local-minio", "--grace", "15"]
    result = run_cli(args, env, tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "unavailable" not in result.stderr  # the stream stayed up: no fallback to polls
    check_report(out, ("delta",), 2000, 6000)
    detail = json.loads((out / "runs" / "delta-2000.json").read_text())
    assert detail["errors"] == []
    assert detail["cost"]["cpu_s_per_million_msgs"]["notify relay"] > 0
    idle = detail["cost"]["idle"]
    assert idle["first_after_idle_s"] > 0
    assert idle["producer_start_to_seen_s"] >= idle["first_after_idle_s"]
    # Per-minute windows: one for a 3 s idle, with every watched component in it.
    (window,) = idle["by_minute"]
    assert {"minio", "etl", "notify relay"} <= window.keys(), window
    assert window["all"] == round(sum(v for k, v in window.items() if k != "all"), 1)


def test_bench_smoke_partitioned(minio: MinioServer, tmp_path: Path) -> None:
    """Two partitions per stream placed by hash (keyed), two ETL processes splitting them:
    every message seen once through the consumer of both unified partitions, each
    partition's share of rows near half, each ETL's CPU reported, and the idle window
    measured with both ETLs."""
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "4", "--warmup", "1", "--idle-s", "2"]
    args += ["--partitions", "2", "--etl-processes", "2", "--partitioner", "hash"]
    args += ["--profile", "100ms", "--out", str(out), "--no-local-minio", "--grace", "15"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    check_report(out, ("delta",), 2000, 6000)
    detail = json.loads((out / "runs" / "delta-2000.json").read_text())
    assert detail["errors"] == [] and detail["checks"]["produced_rows"] == 8000
    assert detail["partitions"] == 2 and detail["etl_processes"] == 2
    assert {"etl", "etl 1"} <= set(detail["cost"]["cpu_s_per_million_msgs"])
    assert sorted(p for r in detail["etl_reports"] for p in r["partitions"]) == [0, 1]
    assert detail["partitioner"] == "hash"
    run_lake = Lake(lake.settings.with_prefix(detail["lake_prefix"]))
    assert read_layout(run_lake) == TimezoneLayout(2, "hash")
    assert run_lake.exists("timezone_unified-p0") and run_lake.exists("timezone_unified-p1")
    # Keyed placement spreads every window: at 2000 msg/s and 100 ms each input partition
    # holds about half the rows (sticky would alternate whole windows).
    shares = [run_lake.open(f"timezone1-p{i}").to_pyarrow_table().num_rows for i in (0, 1)]
    assert min(shares) > 0.4 * sum(shares), shares
    idle = detail["cost"]["idle"]
    assert {"etl", "etl 1"} <= set(idle["cpu_pct_of_one_core"]), idle
    assert idle["first_after_idle_s"] > 0  # the probe reached the consumer after the idle


def test_backlog_drain_takes_one_of_two_etl_processes_down(
    minio: MinioServer, tmp_path: Path
) -> None:
    """With two ETL processes, the drain scenario stops process 0 (SIGTERM) under load
    and restarts it: its partition's backlog is drained, nothing is lost, and process 1
    ran throughout."""
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "19", "--warmup", "1"]
    args += ["--partitions", "2", "--etl-processes", "2", "--backlog-drain", "1"]
    args += ["--profile", "100ms", "--out", str(out), "--no-local-minio", "--grace", "15"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    detail = json.loads((out / "runs" / "delta-2000.json").read_text())
    assert detail["errors"] == [] and detail["lost"] == 0, detail["errors"]
    assert detail["checks"]["produced_rows"] == 2000 * 19
    drain = detail["drain"]
    assert drain["signal"] == "term" and drain["restart_ready_s"] > 0
    assert drain["backlog_messages"] > 0
    assert {"etl", "etl 1", "etl (restarted)"} <= set(detail["cost"]["cpu_pct_of_one_core"])
    owned = sorted(p for r in detail["etl_reports"] for p in r["partitions"])
    assert owned.count(1) == 1 and owned.count(0) >= 1, owned  # the restart owned 0 again
    assert "backlog drain (term): ETL process 0 (of 2) down" in (out / "report.md").read_text()


def test_bench_smoke_kafka(minio: MinioServer, tmp_path: Path) -> None:
    """The same workload over a real Kafka broker and Pathway's Kafka connectors."""
    require_kafka()
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "4", "--warmup", "1", "--backbone"]
    args += ["kafka", "--out", str(out), "--no-local-minio", "--grace", "15"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    check_report(out, ("kafka",), 2000, 6000)


def kafka_streams_ready() -> bool:
    return kafka_ready() and all(shutil.which(t) is not None for t in ("javac", "mvn"))


def test_bench_smoke_kafka_streams(minio: MinioServer, tmp_path: Path) -> None:
    """`--etl kafka-streams`: the Kafka Streams topology (exactly_once_v2) between the
    topics: every message seen once, each timestamp parsed to the value it was sent at."""
    if not kafka_streams_ready():
        why = "Kafka Streams needs Java 17 (javac), Maven and `make kafka-jars`"
        if IN_CI:
            pytest.fail(f"the Kafka Streams benchmark test must run here: {why}")
        pytest.skip(why)
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "4", "--warmup", "1", "--backbone"]
    args += ["kafka", "--etl", "kafka-streams", "--out", str(out), "--no-local-minio"]
    args += ["--grace", "15"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = check_report(out, ("kafka",), 2000, 6000)
    assert [r["etl"] for r in report["runs"]] == ["kafka-streams"]
    detail = json.loads((out / "runs" / "kafka-2000.json").read_text())
    assert detail["errors"] == [] and detail["lost"] == 0, detail["errors"]
    checks = detail["checks"]
    assert checks["produced_rows"] == 2000 * 4, checks
    for key in ("duplicate_rows_seen", "seen_but_not_produced", "parsed_timestamp_mismatches"):
        assert checks[key] == 0, checks


def test_etl_kafka_streams_only_on_the_kafka_backbone(tmp_path: Path) -> None:
    base = {"rates": (1000,), "duration": 5.0, "warmup": 1.0, "profile": "100ms"}
    base |= {"out": tmp_path, "etl": "kafka-streams"}
    assert BenchConfig(backbones=("kafka",), **base).etl == "kafka-streams"
    for backbone in ("delta", "both"):
        with pytest.raises(ConfigError, match="--etl kafka-streams runs the Kafka benchmark"):
            BenchConfig(backbones=parse_backbones(backbone), **base)
    with pytest.raises(ConfigError, match="--partitions > 1"):
        BenchConfig(backbones=("kafka",), partitions=2, **base)


def test_layouts_alternate_and_compare_within_rounds(minio: MinioServer, tmp_path: Path) -> None:
    """`--layouts 1x1,2x2 --rounds 2`: four real runs, the second round in the opposite
    order, and each 2x2 ratio taken over the 1x1 run of its own round."""
    lake = Lake(minio_settings_for(minio, f"bench-{uuid.uuid4().hex[:8]}"))
    out = tmp_path / "out"
    args = ["bench", "--rates", "2000", "--duration", "3", "--warmup", "1", "--grace", "15"]
    args += ["--layouts", "1x1,2x2", "--rounds", "2", "--out", str(out), "--no-local-minio"]
    result = run_cli(args, lake_env(lake), tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "# Layouts compared: 2 rounds, base 1x1" in result.stdout
    summary = json.loads((out / "layouts.json").read_text())
    assert summary["order"] == [["1x1", "2x2"], ["2x2", "1x1"]]

    def detail(round_no: int, p: int) -> dict:
        path = out / f"round{round_no}-p{p}n{p}" / "runs" / "delta-2000.json"
        return json.loads(path.read_text())

    started = {(r, p): detail(r, p)["schedule_start_ms"] for r in (1, 2) for p in (1, 2)}
    assert started[(1, 1)] < started[(1, 2)] < started[(2, 2)] < started[(2, 1)]
    assert detail(2, 2)["partitions"] == 2 and detail(2, 2)["etl_processes"] == 2

    def cores(round_no: int, p: int) -> float:
        return sum(detail(round_no, p)["cost"]["cpu_pct_of_one_core"].values()) / 100

    base, two = summary["rows"]
    assert (base["layout"], two["layout"]) == ("1x1", "2x2")
    assert base["over_base"] is None and base["lost"] == 0 and two["lost"] == 0
    assert two["cores"] == pytest.approx([cores(1, 2), cores(2, 2)])
    ratios = [cores(r, 2) / cores(r, 1) - 1 for r in (1, 2)]
    assert two["over_base"] == pytest.approx(ratios)
    assert two["over_base_mean"] == pytest.approx(sum(ratios) / 2)
    assert {"etl", "etl 1", "minio", "producer"} <= set(two["cpu_s_per_million_msgs"])
    assert "| 2,000 | 2x2 |" in (out / "layouts.md").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layouts", "1x1"], "at least two layouts"),
        (["--layouts", "1x1,2by2"], "is not PARTITIONSxPROCESSES"),
        (["--layouts", "1x1,2x3"], "--etl-processes must be 1..2"),
        (["--layouts", "1x1,2x2", "--partitions", "2"], "not both"),
        (["--layouts", "1x1,2x2", "--backlog-drain", "5", "--duration", "40"], "--backlog-drain"),
        (["--layouts", "1x1,2x2", "--rounds", "0"], "--rounds must be at least 1"),
        (["--partitioner", "hash"], "it needs --partitions > 1"),
        (["--partitions", "2", "--partitioner", "key"], "--partitioner must be one of"),
    ],
)
def test_bench_options_refused_before_any_run(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    env = {**os.environ, "DELTABUS_ENV_FILE": "/dev/null"}
    out = tmp_path / "out"
    result = run_cli(["bench", "--out", str(out), "--no-local-minio", *extra], env, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert not list(out.glob("round*"))


def test_options() -> None:
    assert parse_rates("10000, 30k") == (10000, 30000)
    assert parse_profile("1000ms") == 1.0 and parse_profile("100ms") == 0.1
    for bad in ("", "x", "0"):
        with pytest.raises(ConfigError):
            parse_rates(bad)
    with pytest.raises(ConfigError):
        parse_profile("fast")


def test_backlog_recovery_rule() -> None:
    """An outage from 10 s to 15 s: the backlog is seen at once at 17 s, then latency is
    0.3 s again; recovery is measured from the resumption (15 s)."""
    con = duckdb.connect()
    con.execute(
        f"""CREATE TABLE {SAMPLES_TABLE} AS
            SELECT sent_ms,
                   CASE WHEN sent_ms >= 10000 AND sent_ms < 17000 THEN 17000.0
                        ELSE sent_ms + 300 END AS seen_ms
            FROM (SELECT i * 10.0 AS sent_ms FROM range(3000) t(i))"""
    )
    con.execute(f"ALTER TABLE {SAMPLES_TABLE} ADD COLUMN latency_ms DOUBLE")
    con.execute(f"UPDATE {SAMPLES_TABLE} SET latency_ms = seen_ms - sent_ms")
    r = recovery(con, down_ms=10000, resumed_ms=15000, warmup_end_ms=2000, threshold_s=1.0)
    assert r["backlog_messages"] == 500 and r["peak_latency_s"] == pytest.approx(7.0)
    assert r["backlog_drained_s"] == pytest.approx(2.0)
    assert r["recovery_s_p99"] == pytest.approx(3.0)  # the 17 s bucket holds the backlog
    assert r["baseline_p99_s"] == pytest.approx(0.3)


def _processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_sigterm_stops_a_benchmark_and_everything_it_started(tmp_path: Path) -> None:
    """SIGTERM is Ctrl-C for `deltabus bench`: its MinIO, producer, ETL and maintenance
    stop with it, and it exits with status 143."""
    marker = f"SIGTERM_TEST_MARK={uuid.uuid4().hex}"  # not DELTABUS_*: children keep it
    env = {
        **os.environ,
        "DELTABUS_ENV_FILE": os.devnull,
        marker.split("=")[0]: marker.split("=")[1],
    }
    args = ["bench", "--local-minio", "--rates", "2000", "--duration", "120", "--warmup", "1"]
    args += ["--soak", "--maintenance-interval", "20", "--out", str(tmp_path / "out")]
    bench = subprocess.Popen(
        [sys.executable, "-m", "deltabus", *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert bench.stderr is not None
        for line in bench.stderr:
            if "producing" in line:
                break
        else:
            raise AssertionError(f"the benchmark ended before producing: {bench.wait()}")
        assert len(_processes_with(marker)) >= 3  # itself, MinIO, the producer and the ETL
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(90) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30
        while (left := _processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]
    finally:
        if bench.poll() is None:
            bench.kill()


@pytest.mark.parametrize("absent", ["matplotlib", "confluent_kafka"])
def test_bench_without_its_extra_says_how_to_install_it(tmp_path: Path, absent: str) -> None:
    """Without the `bench` extra, `deltabus bench` is one clear error (exit 2) before any
    run; confluent-kafka is needed only for the Kafka backbone."""
    blocked = f"import sys; sys.modules[{absent!r}] = None"  # as if it were not installed
    run = f"{blocked}; from deltabus.cli import main; main()"
    env = {**os.environ, "DELTABUS_ENV_FILE": os.devnull, "DELTABUS_STORAGE": "local"}
    for backbone, refused in (("delta", absent == "matplotlib"), ("kafka", True)):
        # An invalid profile: past the extra's check, the run is refused before it starts.
        args = ["bench", "--rates", "1000", "--backbone", backbone, "--profile", "nope"]
        result = subprocess.run(
            [sys.executable, "-c", run, *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if refused:
            assert result.returncode == 2, result.stderr[-2000:]
            assert "deltabus[bench]" in result.stderr and "Traceback" not in result.stderr
        else:
            assert result.returncode == 2 and "profile" in result.stderr, result.stderr[-2000:]
            assert "deltabus[bench]" not in result.stderr
