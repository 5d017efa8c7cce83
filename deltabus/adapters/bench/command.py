"""The `deltabus bench` command: options and help. Imports only typer at load time; the
harness (Pathway, matplotlib, confluent-kafka) is imported when the command runs."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from deltabus.adapters.bench.config import BenchConfig
    from deltabus.core.settings import Settings

HELP = (
    "Measure end-to-end latency: producer -> Delta (MinIO) -> Pathway ETL -> consumer.\n\n"
    "For each rate: a fresh lake prefix, the ETL as its own process (continuous mode), an "
    "open-loop producer (message i is due at start + i/rate; its `date` is that scheduled "
    "time) and a consumer tailing timezone_unified that records when it first sees every "
    "row. Latency = first seen - scheduled send time. Samples go to the Delta table "
    "latency_samples under the run's prefix; DuckDB computes p50 .. p99.9 and max over the "
    "samples after the warm-up.\n\n"
    "Writes to --out: report.json, report.md, latency-<backbone>-<rate>.png, "
    "percentiles-vs-rate.png, runs/<backbone>-<rate>.json (details) and logs/. Exits 1 "
    "when a message was lost (produced, never seen) or a check failed, after writing the "
    "reports.\n\n"
    "--soak-minutes M runs one rate for M minutes after the warm-up with lake maintenance "
    "(compact, checkpoint, log cleanup, vacuum) every --maintenance-interval s, and reports "
    "per --window-minutes window: p50/p99 (a log-bucketed histogram, within 1 %), CPU per "
    "component, resident memory per process, objects and bytes under the run's prefix, "
    "requests per second by class and the load average, in windows.json, windows.md and "
    "windows.png, with its three goals (p99 drift, memory growth, object count) beside "
    "their targets. No sample is kept per message (no report.md): memory stays flat.\n\n"
    "--store puts a latency-injecting proxy between every component and MinIO (toxiproxy, "
    "plus a per-request tail stage for s3-standard); the reports name the store profile. "
    "`deltabus store-check --store NAME` measures what a profile delivers per request.\n\n"
    "Examples:\n\n"
    "deltabus bench --rates 10000,30000 --duration 30 --warmup 5 --profile 100ms\n\n"
    "deltabus bench --rates 10000 --backbone both --out bench-out\n\n"
    "deltabus bench --rates 10000 --duration 60 --backlog-drain 10\n\n"
    "deltabus bench --rates 10k,150k --layouts 1x1,2x2,4x2 --rounds 3 --out layouts-out\n\n"
    "deltabus bench --local-minio --store s3-standard --rates 10000 --out bench-out/s3-standard\n\n"
    "deltabus bench --local-minio --rates 50000 --warmup 60 --soak-minutes 120 "
    "--window-minutes 10 --vacuum-retention-hours 1 --out soak-out\n\n"
    "deltabus bench --workload workloads/s3-standard.yaml"
)


def _workload(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    from deltabus.adapters.bench.workload_file import apply_workload

    return apply_workload(ctx, param, value)


def require_bench_extra(kafka: bool) -> None:
    """Raise ConfigError when a package of the `bench` extra cannot be imported
    (matplotlib, and confluent-kafka for the Kafka backbone)."""
    from importlib import import_module

    from deltabus.core.errors import ConfigError

    wanted = {"matplotlib": "matplotlib"}
    if kafka:
        wanted["confluent_kafka"] = "confluent-kafka"
    missing = []
    for module, package in wanted.items():
        try:
            import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise ConfigError(
            f"deltabus bench needs {', '.join(missing)}, which is not installed",
            "install the bench extra: pip install 'deltabus[bench]' (in this repository: "
            "make venv)",
        )


def bench(
    workload: Annotated[
        Path | None,
        typer.Option(
            help="A YAML file of these options (workloads/*.yaml: `rates: [10000, 30000]`, "
            "`store: s3-standard`, ...; `-` or `_` alike, plus a free-text `description`). "
            "Options given on the command line win over the file's.",
            is_eager=True,
            callback=_workload,
        ),
    ] = None,
    rates: Annotated[
        str, typer.Option(help="Comma-separated target rates in msg/s (10000,30000 or 10k,30k).")
    ] = "10000",
    duration: Annotated[
        float | None,
        typer.Option(
            help="Seconds of producing per rate (default 30; a windowed soak: --warmup + "
            "--soak-minutes)."
        ),
    ] = None,
    warmup: Annotated[
        float, typer.Option(help="Seconds at the start whose samples are discarded.")
    ] = 5,
    profile: Annotated[
        str,
        typer.Option(help="Commit interval of producer AND ETL: 100ms or 1000ms (any Nms)."),
    ] = "100ms",
    seed: Annotated[int, typer.Option(help="Seed of the producers' table choice.")] = 0,
    out: Annotated[Path, typer.Option(help="Directory for reports, plots and logs.")] = Path(
        "bench-out"
    ),
    backbone: Annotated[
        str,
        typer.Option(
            help="delta, kafka (the same workload on a local Kafka 4.3.1 broker via "
            "platform/kafka.sh; needs Java 17) or both (side by side per rate)."
        ),
    ] = "delta",
    local_minio: Annotated[
        bool | None,
        typer.Option(
            "--local-minio/--no-local-minio",
            help="Start a throwaway MinIO on a free loopback port with a temporary data "
            "directory. Default: only when no MinIO secret key is configured.",
        ),
    ] = None,
    producers: Annotated[
        int,
        typer.Option(help="Concurrent producers on the same tables (distinct run ids, rate/K)."),
    ] = 1,
    partitions: Annotated[
        int,
        typer.Option(
            help="Partitions per stream (each its own Delta table; the unified output is "
            "partitioned alike). 1: the original layout.",
        ),
    ] = 1,
    etl_processes: Annotated[
        int,
        typer.Option(help="ETL processes splitting the partitions (1..partitions)."),
    ] = 1,
    partitioner: Annotated[
        str,
        typer.Option(
            help="How the run's new lake places messages among --partitions: sticky (a commit "
            "window's messages to one partition, the next window's to the next) or hash "
            "(every message by a hash of its number: keyed placement, every partition "
            "gets rows every window)."
        ),
    ] = "sticky",
    layouts: Annotated[
        str | None,
        typer.Option(
            help="Compare partition layouts PxN (partitions x ETL processes), e.g. "
            "1x1,2x2,4x2: each of --rounds rounds runs every layout once, in the opposite "
            "order to the round before, and each layout's CPU is compared with the first "
            "layout's of the same round, so the machine's drift over the session cancels. "
            "Writes layouts.md and layouts.json in --out, each run's report in "
            "round<R>-p<P>n<N>/. Instead of --partitions/--etl-processes.",
        ),
    ] = None,
    rounds: Annotated[int, typer.Option(help="--layouts: rounds over all layouts.")] = 3,
    producer_mode: Annotated[
        str,
        typer.Option(
            help="process: each producer in its own process (default, disturbs the "
            "measurement least); inline: threads in the benchmark process."
        ),
    ] = "process",
    backlog_drain: Annotated[
        float,
        typer.Option(
            help="Scenario: take the ETL down for N s under load, then resume it and "
            "report the time until latency is back under --recovery-threshold. With "
            "--etl-processes > 1, process 0 goes down and the others go on."
        ),
    ] = 0,
    drain_signal: Annotated[
        str,
        typer.Option(
            help="term: SIGTERM and restart the ETL (it resumes from its commits); "
            "stop: SIGSTOP then SIGCONT."
        ),
    ] = "term",
    recovery_threshold: Annotated[
        float, typer.Option(help="Backlog drain: 'recovered' once latency stays under this (s).")
    ] = 1.0,
    soak: Annotated[
        bool,
        typer.Option(
            help="Scenario: run lake maintenance (compact, checkpoint, vacuum with 24 h "
            "retention) every --maintenance-interval s and report latency per quarter."
        ),
    ] = False,
    maintenance_interval: Annotated[
        float | None,
        typer.Option(
            help="Soak: seconds between maintenance passes (default 60; with --soak-minutes "
            "the window length, each pass half-way through a window)."
        ),
    ] = None,
    soak_minutes: Annotated[
        float,
        typer.Option(
            help="Scenario: a soak of this many minutes after the warm-up at one rate, with "
            "maintenance, reported per --window-minutes window (windows.json, windows.md, "
            "windows.png) with its goals; no per-message samples are kept.",
        ),
    ] = 0,
    window_minutes: Annotated[
        float, typer.Option(help="--soak-minutes: length of a window (minutes).")
    ] = 10,
    vacuum_retention_hours: Annotated[
        int | None,
        typer.Option(
            help="Soak: vacuum removes files unreferenced for this many hours (whole hours, "
            ">= 1). Default: 24 h or 4 x the run, whichever is longer; a shorter one lets "
            "the object count level off within the run. The run's tables keep removed files in "
            "their log state as long (delta.deletedFileRetentionDuration)."
        ),
    ] = None,
    log_retention_s: Annotated[
        int | None,
        typer.Option(
            help="Log retention of the run's tables in seconds (delta.logRetentionDuration; "
            "log files behind a checkpoint and older than this are cleaned up). Default: "
            "DELTABUS_LOG_RETENTION_S, and with --soak-minutes 600 s when that is not set."
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(
            help="After producing ends, a message not seen once the consumer has made no "
            "progress for this many seconds is lost."
        ),
    ] = 20,
    poll_ms: Annotated[float, typer.Option(help="Consumer poll interval (ms).")] = 20,
    etl_poll_ms: Annotated[
        float | None, typer.Option(help="ETL input poll interval (ms); default: the ETL's own.")
    ] = None,
    interval: Annotated[
        float, typer.Option(help="Bucket (s) of the latency-over-time plots.")
    ] = 1.0,
    idle_s: Annotated[
        float,
        typer.Option(
            help="After each Delta run, keep the ETL and consumer running without traffic for "
            "this many seconds and report their CPU and object-store requests (idle cost)."
        ),
    ] = 0,
    notify: Annotated[
        bool,
        typer.Option(
            help="With --local-minio: MinIO pushes every commit to a `deltabus notify relay` "
            "(its webhook target) and tails wait on those events instead of polling; the "
            "relay's CPU is a component of its own."
        ),
    ] = False,
    progress: Annotated[
        bool, typer.Option(help="Live progress on stderr (a terminal only; else log lines).")
    ] = True,
    serve: Annotated[
        str | None,
        typer.Option(
            help="postgres or opensearch: also run that serving sink (`deltabus serve "
            "postgres|opensearch --follow`) and report the stage 'unified commit -> served', "
            "its verdict and CPU (the sink and the store's server). postgres: a message is "
            "served once visible in PostgreSQL; uses DELTABUS_POSTGRES_DSN (a fresh table), "
            "else a throwaway PostgreSQL on loopback. opensearch: once searchable in the "
            "index; uses DELTABUS_OPENSEARCH_URL (a fresh index, deleted afterwards), else a "
            "throwaway node on loopback (Java 17). The OpenSearch sink acknowledges a batch "
            "once searchable, so that stage is about half --serve-refresh-ms plus the bulk "
            "request. Delta backbone only."
        ),
    ] = None,
    serve_refresh_ms: Annotated[
        int | None,
        typer.Option(
            help="With --serve opensearch: the served index's refresh interval (ms, "
            "1..60000; default: the sink's, 1000). Shorter makes documents searchable "
            "sooner at the cost of more segments and merges."
        ),
    ] = None,
    serve_replay: Annotated[
        bool,
        typer.Option(
            help="With --serve: after each run, with nothing else running, a fresh sink "
            "(`deltabus serve <backend> --once`) loads the unified table's whole net content "
            "into a fresh table or index; reports its rows per second and the CPU of the "
            "sink and the store's server (the sink's standalone bulk rate)."
        ),
    ] = False,
    etl: Annotated[
        str,
        typer.Option(
            help="The ETL between the tables: pathway (deltabus' ETL process) or spark (the "
            "same transform as a Spark Structured Streaming job: Delta streaming source and "
            "sink, trigger processingTime = --profile; its JVM is the 'etl' CPU). Spark needs "
            "`make spark` once; it runs the Delta backbone on one partition only (no "
            "--partitions, --layouts, --backlog-drain, --soak, --soak-minutes, --idle-s)."
        ),
    ] = "pathway",
    store: Annotated[
        str,
        typer.Option(
            help="Store profile: loopback (MinIO directly), s3-express (about 3-5 ms a "
            "request) or s3-standard (median about 27 ms, p99 about 180 ms: a per-request "
            "long tail). Producer, ETL, consumer and sinks reach MinIO through the "
            "profile's proxy; MinIO's metrics are read directly. Needs a plain-http MinIO; "
            "toxiproxy is built with Go on first use.",
        ),
    ] = "loopback",
) -> None:
    from deltabus.adapters import cli_state as cli
    from deltabus.adapters.bench.config import (
        BenchConfig,
        parse_backbones,
        parse_profile,
        parse_rates,
    )
    from deltabus.core.errors import ConfigError

    require_bench_extra(kafka="kafka" in parse_backbones(backbone))
    parse_profile(profile)
    settings = cli.settings()
    if soak_minutes > 0:
        if duration is not None:
            raise ConfigError(
                "--soak-minutes sets the run's length (--warmup + --soak-minutes)",
                "give --soak-minutes or --duration, not both",
            )
        duration = warmup + soak_minutes * 60
        if log_retention_s is None and settings.log_retention_s is None:
            log_retention_s = SOAK_LOG_RETENTION_S
    if maintenance_interval is None:
        maintenance_interval = window_minutes * 60 if soak_minutes > 0 else 60.0
    config = BenchConfig(
        rates=parse_rates(rates),
        duration=30.0 if duration is None else duration,
        warmup=warmup,
        profile=profile,
        out=out,
        seed=seed,
        backbones=parse_backbones(backbone),
        producers=producers,
        partitions=partitions,
        etl_processes=etl_processes,
        partitioner=partitioner.strip().lower(),
        producer_mode=producer_mode,
        backlog_drain=backlog_drain,
        drain_signal=drain_signal,
        recovery_threshold=recovery_threshold,
        soak=soak,
        maintenance_interval=maintenance_interval,
        soak_minutes=soak_minutes,
        window_minutes=window_minutes,
        vacuum_retention_hours=vacuum_retention_hours,
        log_retention_s=log_retention_s,
        grace=grace,
        consumer_poll_ms=poll_ms,
        etl_poll_ms=etl_poll_ms,
        interval_s=interval,
        idle_s=idle_s,
        notify=notify,
        serve=serve.strip().lower() if serve else None,
        serve_refresh_ms=serve_refresh_ms,
        serve_replay=serve_replay,
        store=store.strip().lower(),
        etl=etl.strip().lower(),
        command=shlex.join(["deltabus", *sys.argv[1:]]),
    )
    if config.etl == "spark":
        if layouts is not None:
            raise ConfigError(
                "--etl spark runs the unpartitioned layout only; --layouts is not supported "
                "with it",
                "drop --layouts, or use --etl pathway",
            )
        from deltabus.adapters.bench.spark_etl import require

        require()  # pyspark, Java and the jars of `make spark`, before any run
    if config.partitioner != "sticky" and config.partitions == 1 and layouts is None:
        raise ConfigError(
            "--partitioner places messages among partitions: it needs --partitions > 1"
        )
    if layouts is not None:
        _compare_layouts(config, layouts, rounds, local_minio=local_minio, progress=progress)
        return
    report = run(config, settings, local_minio=local_minio, show_progress=progress)
    errors = report.pop("errors", [])
    if cli.state.as_json:
        print(__import__("json").dumps(report))
    elif config.windowed:
        _print_soak(out, report)
    else:
        from deltabus.adapters.bench.report import console_text

        runs, machine = report["runs"], report["machine"]
        print(console_text(config.profile, machine, config.command, runs, config.store))
        print(f"\nreport: {out / 'report.md'}  (report.json, plots and logs in {out})")
    if errors:
        for e in errors:
            print(f"deltabus bench: error: {e}", file=sys.stderr)
        raise typer.Exit(1)


bench.__doc__ = HELP

# A windowed soak's log retention when none is configured: log cleanup is part of what it
# soaks, and ten minutes is far beyond the lag of a reader that keeps up.
SOAK_LOG_RETENTION_S = 600


def _print_soak(out: Path, report: dict) -> None:
    """The goals (met or not, each figure beside its target) and the per-window table."""
    from deltabus.adapters.bench.soak_report import goal_lines, soak_console

    print(soak_console(report))
    print()
    for line in goal_lines(report["goals"]):
        print(line)
    print(f"\nreport: {out / 'windows.md'}  (windows.json, windows.png and logs in {out})")


STORE_CHECK_HELP = (
    "Measure what a store profile delivers: per-request latency through its proxy.\n\n"
    "Sends --requests requests of each class (GET of a 1 KiB object, GET of a missing "
    "object, PUT of 1 KiB, LIST of a small prefix), one at a time through one obstore store "
    "(the client of deltabus' hot paths), first to MinIO directly and then through the "
    "profile's proxy, and prints p50 / p90 / p99 / max (ms) per class beside the profile's "
    "modelled injected delay. Writes objects under a store-check-* folder of the lake's "
    "prefix.\n\n"
    "Example: deltabus store-check --store s3-standard --requests 400"
)


def store_check(
    store: Annotated[
        str, typer.Option(help="Store profile to measure: s3-express, s3-standard or loopback.")
    ] = "s3-standard",
    requests: Annotated[int, typer.Option(help="Requests per request class.")] = 400,
    seed: Annotated[int, typer.Option(help="Seed of the proxies' draws.")] = 0,
    local_minio: Annotated[
        bool | None,
        typer.Option(
            "--local-minio/--no-local-minio",
            help="Measure in front of a throwaway MinIO on loopback (as `deltabus bench "
            "--local-minio`). Default: only when no MinIO secret key is configured.",
        ),
    ] = None,
) -> None:
    import tempfile

    from deltabus.adapters import cli_state as cli
    from deltabus.adapters.bench.environment import minio_configured, throwaway_minio
    from deltabus.adapters.bench.store_profiles import check, check_markdown
    from deltabus.core.errors import ConfigError

    if requests < 1:
        raise ConfigError("--requests must be at least 1")
    settings = cli.settings()
    if local_minio is None:
        local_minio = not minio_configured(settings) and settings.storage == "minio"
    with tempfile.TemporaryDirectory(prefix="deltabus-store-check-") as tmp:
        if local_minio:
            with throwaway_minio() as (minio_settings, _):
                result = check(store, minio_settings, Path(tmp), requests, seed)
        else:
            if settings.storage != "minio":
                raise ConfigError("store-check measures a MinIO; this lake is a local directory")
            result = check(store, settings, Path(tmp), requests, seed)
    if cli.state.as_json:
        print(__import__("json").dumps(result))
    else:
        print(check_markdown(result))


store_check.__doc__ = STORE_CHECK_HELP


def _compare_layouts(
    config, text: str, rounds: int, *, local_minio: bool | None, progress: bool
) -> None:
    """--layouts: the alternating comparison (bench.layouts), printed as a table."""
    from deltabus.adapters import cli_state as cli
    from deltabus.adapters.bench.layouts import compare, parse_layouts
    from deltabus.core.errors import ConfigError

    layouts = parse_layouts(text)
    if (config.partitions, config.etl_processes) != (1, 1):
        raise ConfigError("give either --layouts or --partitions/--etl-processes, not both")
    scenario = [
        name
        for name, on in (
            ("--backbone kafka", "kafka" in config.backbones),
            ("--backlog-drain", config.backlog_drain > 0),
            ("--soak", config.soak),
            ("--soak-minutes", config.windowed),
            ("--serve", config.serve is not None),
        )
        if on
    ]
    if scenario:
        raise ConfigError(
            f"--layouts compares the steady cost of Delta layouts; {', '.join(scenario)} "
            "is not part of that",
            "run the scenario with --partitions P --etl-processes N instead",
        )
    settings = cli.settings()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    summary = compare(
        config,
        layouts,
        rounds,
        lambda cfg: run(cfg, settings, local_minio=local_minio, show_progress=progress),
        log=log,
    )
    errors = summary.pop("errors")
    if cli.state.as_json:
        print(__import__("json").dumps(summary))
    else:
        print((config.out / "layouts.md").read_text().rstrip())
        print(f"\nsummary: {config.out / 'layouts.md'}  (layouts.json; each run in {config.out})")
    if errors:
        for e in errors:
            print(f"deltabus bench: error: {e}", file=sys.stderr)
        raise typer.Exit(1)


def run(config, settings, *, local_minio: bool | None = None, show_progress: bool = True) -> dict:
    """Run the benchmark on `settings` (or a throwaway MinIO); returns report.json + errors."""

    from deltabus.adapters.bench.environment import minio_configured, throwaway_minio
    from deltabus.adapters.bench.runner import Bench
    from deltabus.core.errors import ConfigError
    from deltabus.delta.lake import Lake

    if local_minio is None:
        local_minio = not minio_configured(settings) and settings.storage == "minio"
    if local_minio:
        with throwaway_minio(notify=config.notify) as (minio_settings, pids):
            with _store_proxy(config, minio_settings) as (proxied, proxy_pids):
                return Bench(
                    config,
                    proxied,
                    minio_pid=pids["minio"],
                    relay_pid=pids.get("relay"),
                    show_progress=show_progress,
                    metrics_endpoint=minio_settings.minio_endpoint,
                    proxy_pids=proxy_pids,
                ).run()
    if config.notify:
        raise ConfigError(
            "--notify starts its own MinIO and relay: add --local-minio",
            "for your own MinIO, run `deltabus notify relay`, point MinIO's webhook target at it "
            "and set DELTABUS_NOTIFY=true and DELTABUS_NOTIFY_URL (docs/design/tailing.md)",
        )
    Lake(settings).check(write=True)
    with _store_proxy(config, settings) as (proxied, proxy_pids):
        return Bench(
            config,
            proxied,
            minio_pid=_minio_pid(settings),
            show_progress=show_progress,
            metrics_endpoint=settings.minio_endpoint,
            proxy_pids=proxy_pids,
        ).run()


@contextmanager
def _store_proxy(
    config: BenchConfig, settings: Settings
) -> Iterator[tuple[Settings, dict[str, int]]]:
    """(`settings` with MinIO reached through the store profile's proxy, the proxies' pids
    by name) while it runs (the loopback profile: `settings` unchanged, nothing started)."""
    from deltabus.adapters.bench.store_profiles import StoreProxy, profile
    from deltabus.core.errors import ConfigError

    chosen = profile(config.store)
    if not chosen.proxied:
        yield settings, {}
        return
    if settings.storage != "minio":
        raise ConfigError(
            f"--store {chosen.name} goes in front of MinIO; this lake is a local directory",
            "use --local-minio or a MinIO lake",
        )
    with StoreProxy(chosen, settings.minio_endpoint, config.out / "logs") as proxy:
        yield settings.model_copy(update={"minio_endpoint": proxy.endpoint}), proxy.pids


def _minio_pid(settings) -> int | None:
    """The pid of a MinIO on this machine serving the endpoint's port (for CPU figures)."""
    import re

    m = re.match(r"https?://(127\.0\.0\.1|localhost)(?::(\d+))?", settings.minio_endpoint)
    if settings.storage != "minio" or not m:
        return None
    import psutil

    port = m.group(2) or "80"
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].endswith("minio") and any(c.endswith(f":{port}") for c in cmd):
            return int(proc.info["pid"])
    return None
