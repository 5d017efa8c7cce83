"""The `deltabus bench` command: options and help. Imports only typer at load time; the
harness (Pathway, matplotlib, confluent-kafka) is imported when the command runs."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from deltabus_bench import options as opt

if TYPE_CHECKING:
    from deltabus.core.settings import Settings
    from deltabus_bench.config import BenchConfig

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


def require_bench_extra(kafka: bool) -> None:
    """Raise MissingExtraError before any run when a module of the `bench` extra is not
    installed (confluent-kafka only for the Kafka backbone)."""
    from deltabus.core.extras import EXTRA_MODULES, require_extra

    modules = EXTRA_MODULES["bench"]
    require_extra("bench", "deltabus bench", modules if kafka else modules - {"confluent_kafka"})


def bench(
    ctx: typer.Context,
    workload: opt.Workload = None,
    rates: opt.Rates = "10000",
    duration: opt.Duration = None,
    warmup: opt.Warmup = 5,
    profile: opt.Profile = "100ms",
    seed: opt.Seed = 0,
    out: opt.Out = Path("bench-out"),
    backbone: opt.Backbone = "delta",
    local_minio: opt.LocalMinio = None,
    producers: opt.Producers = 1,
    partitions: opt.Partitions = 1,
    etl_processes: opt.EtlProcesses = 1,
    partitioner: opt.Partitioner = "sticky",
    layouts: opt.Layouts = None,
    rounds: opt.Rounds = 3,
    producer_mode: opt.ProducerMode = "process",
    backlog_drain: opt.BacklogDrain = 0,
    drain_signal: opt.DrainSignal = "term",
    recovery_threshold: opt.RecoveryThreshold = 1.0,
    soak: opt.Soak = False,
    maintenance_interval: opt.MaintenanceInterval = None,
    soak_minutes: opt.SoakMinutes = 0,
    window_minutes: opt.WindowMinutes = 10,
    vacuum_retention_hours: opt.VacuumRetentionHours = None,
    log_retention_s: opt.LogRetentionS = None,
    retention_s: opt.RetentionS = None,
    grace: opt.Grace = 20,
    poll_ms: opt.PollMs = 20,
    etl_poll_ms: opt.EtlPollMs = None,
    interval: opt.Interval = 1.0,
    idle_s: opt.IdleS = 0,
    notify: opt.Notify = None,
    progress: opt.Progress = True,
    serve: opt.Serve = None,
    serve_refresh_ms: opt.ServeRefreshMs = None,
    serve_in_flight: opt.ServeInFlight = None,
    serve_replay: opt.ServeReplay = False,
    etl: opt.Etl = "pathway",
    store: opt.Store = "loopback",
) -> None:
    from deltabus.cli import state as cli
    from deltabus_bench.config import parse_backbones

    require_bench_extra(kafka="kafka" in parse_backbones(backbone))
    settings = cli.settings()
    config = bench_config(ctx.params, settings)
    _refuse_unsupported(config, layouts)
    from deltabus_bench.session import compare_layouts, run

    if layouts is not None:
        compare_layouts(config, layouts, rounds, local_minio=local_minio, progress=progress)
        return
    report = run(config, settings, local_minio=local_minio, show_progress=progress)
    errors = report.pop("errors", [])
    if cli.state.as_json:
        print(__import__("json").dumps(report))
    elif config.windowed:
        _print_soak(out, report)
    else:
        from deltabus_bench.report import console_text
        from deltabus_bench.results import RunSummary

        runs = [RunSummary.model_validate(r) for r in report["runs"]]
        machine = report["machine"]
        print(console_text(config.profile, machine, config.command, runs, config.store))
        print(f"\nreport: {out / 'report.md'}  (report.json, plots and logs in {out})")
    if errors:
        for e in errors:
            print(f"deltabus bench: error: {e}", file=sys.stderr)
        raise typer.Exit(1)


bench.__doc__ = HELP


def bench_config(params: dict[str, Any], settings: Settings) -> BenchConfig:
    """The run's configuration from the command's options (`ctx.params`) and settings:
    a soak's length and log retention, the maintenance interval, parsed lists."""
    from deltabus.core.errors import ConfigError
    from deltabus_bench.config import (
        BenchConfig,
        parse_backbones,
        parse_profile,
        parse_rates,
    )

    p = dict(params)
    parse_profile(p["profile"])
    if p["soak_minutes"] > 0:
        if p["duration"] is not None:
            raise ConfigError(
                "--soak-minutes sets the run's length (--warmup + --soak-minutes)",
                "give --soak-minutes or --duration, not both",
            )
        p["duration"] = p["warmup"] + p["soak_minutes"] * 60
        if p["log_retention_s"] is None and settings.log_retention_s is None:
            p["log_retention_s"] = SOAK_LOG_RETENTION_S
    if p["maintenance_interval"] is None:
        p["maintenance_interval"] = p["window_minutes"] * 60 if p["soak_minutes"] > 0 else 60.0
    return BenchConfig(
        rates=parse_rates(p["rates"]),
        duration=30.0 if p["duration"] is None else p["duration"],
        warmup=p["warmup"],
        profile=p["profile"],
        out=p["out"],
        seed=p["seed"],
        backbones=parse_backbones(p["backbone"]),
        producers=p["producers"],
        partitions=p["partitions"],
        etl_processes=p["etl_processes"],
        partitioner=p["partitioner"].strip().lower(),
        producer_mode=p["producer_mode"],
        backlog_drain=p["backlog_drain"],
        drain_signal=p["drain_signal"],
        recovery_threshold=p["recovery_threshold"],
        soak=p["soak"],
        maintenance_interval=p["maintenance_interval"],
        soak_minutes=p["soak_minutes"],
        window_minutes=p["window_minutes"],
        vacuum_retention_hours=p["vacuum_retention_hours"],
        log_retention_s=p["log_retention_s"],
        retention_s=p["retention_s"],
        grace=p["grace"],
        consumer_poll_ms=p["poll_ms"],
        etl_poll_ms=p["etl_poll_ms"],
        interval_s=p["interval"],
        idle_s=p["idle_s"],
        notify=p["notify"],
        serve=p["serve"].strip().lower() if p["serve"] else None,
        serve_refresh_ms=p["serve_refresh_ms"],
        serve_in_flight=p["serve_in_flight"],
        serve_replay=p["serve_replay"],
        store=p["store"].strip().lower(),
        etl=p["etl"].strip().lower(),
        command=shlex.join(["deltabus", *sys.argv[1:]]),
    )


def _refuse_unsupported(config: BenchConfig, layouts: str | None) -> None:
    """Refuse option combinations no run supports, before any run starts."""
    from deltabus.core.errors import ConfigError

    if config.etl == "spark":
        if layouts is not None:
            raise ConfigError(
                "--etl spark runs the unpartitioned layout only; --layouts is not supported "
                "with it",
                "drop --layouts, or use --etl pathway",
            )
        from deltabus_bench.delta.spark_etl import require

        require()  # pyspark, Java and the jars of `make spark`, before any run
    if config.etl == "kafka-streams":
        from deltabus_bench.kafka import streams_etl as kafka_streams_etl

        kafka_streams_etl.require()  # fetched and compiled (cached), before any run
    if config.partitioner != "sticky" and config.partitions == 1 and layouts is None:
        raise ConfigError(
            "--partitioner places messages among partitions: it needs --partitions > 1"
        )


# A windowed soak's log retention when none is configured: log cleanup is part of what it
# soaks, and ten minutes is far beyond the lag of a reader that keeps up.
SOAK_LOG_RETENTION_S = 600


def _print_soak(out: Path, report: dict) -> None:
    """The goals (met or not, each figure beside its target) and the per-window table."""
    from deltabus_bench.soak_markdown import soak_console
    from deltabus_bench.soak_report import goal_lines

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

    from deltabus.cli import state as cli
    from deltabus.core.errors import ConfigError
    from deltabus_bench.environment import minio_configured, throwaway_minio
    from deltabus_bench.store_check import check, check_markdown

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


def register(app: typer.Typer) -> None:
    """Add `bench` and `store-check` to the `deltabus` command line (its plugin hook)."""
    from deltabus.core.extras import needs_extra

    app.command("bench")(needs_extra("bench", "deltabus bench")(bench))
    app.command("store-check")(needs_extra("bench", "deltabus store-check")(store_check))
