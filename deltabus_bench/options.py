"""The options of `deltabus bench`, each a typer option type: the command's signature
names them, so its help is generated from these. Imports only typer at load time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def _workload(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """`--workload FILE`: the file's options become the defaults of the others."""
    if value is None:
        return None
    from deltabus.core.extras import needs_extra

    with needs_extra("bench", "deltabus bench --workload"):
        from deltabus_bench.workload_file import apply_workload

    return apply_workload(ctx, param, value)


Workload = Annotated[
    Path | None,
    typer.Option(
        help="A YAML file of these options (workloads/*.yaml: `rates: [10000, 30000]`, "
        "`store: s3-standard`, ...; `-` or `_` alike, plus a free-text `description`). "
        "Options given on the command line win over the file's.",
        is_eager=True,
        callback=_workload,
    ),
]

Rates = Annotated[
    str, typer.Option(help="Comma-separated target rates in msg/s (10000,30000 or 10k,30k).")
]

Duration = Annotated[
    float | None,
    typer.Option(
        help="Seconds of producing per rate (default 30; a windowed soak: --warmup + "
        "--soak-minutes)."
    ),
]

Warmup = Annotated[float, typer.Option(help="Seconds at the start whose samples are discarded.")]

Profile = Annotated[
    str,
    typer.Option(help="Commit interval of producer AND ETL: 100ms or 1000ms (any Nms)."),
]

Seed = Annotated[int, typer.Option(help="Seed of the producers' table choice.")]

Out = Annotated[Path, typer.Option(help="Directory for reports, plots and logs.")]

Backbone = Annotated[
    str,
    typer.Option(
        help="delta, kafka (the same workload on a local Kafka 4.3.1 broker via "
        "platform/kafka.sh; needs Java 17) or both (side by side per rate)."
    ),
]

LocalMinio = Annotated[
    bool | None,
    typer.Option(
        "--local-minio/--no-local-minio",
        help="Start a throwaway MinIO on a free loopback port with a temporary data "
        "directory. Default: only when no MinIO secret key is configured.",
    ),
]

Producers = Annotated[
    int,
    typer.Option(help="Concurrent producers on the same tables (distinct run ids, rate/K)."),
]

Partitions = Annotated[
    int,
    typer.Option(
        help="Partitions per stream (each its own Delta table; the unified output is "
        "partitioned alike). 1: the original layout.",
    ),
]

EtlProcesses = Annotated[
    int,
    typer.Option(help="ETL processes splitting the partitions (1..partitions)."),
]

Partitioner = Annotated[
    str,
    typer.Option(
        help="How the run's new lake places messages among --partitions: sticky (a commit "
        "window's messages to one partition, the next window's to the next) or hash "
        "(every message by a hash of its number: keyed placement, every partition "
        "gets rows every window)."
    ),
]

Layouts = Annotated[
    str | None,
    typer.Option(
        help="Compare partition layouts PxN (partitions x ETL processes), e.g. "
        "1x1,2x2,4x2: each of --rounds rounds runs every layout once, in the opposite "
        "order to the round before, and each layout's CPU is compared with the first "
        "layout's of the same round, so the machine's drift over the session cancels. "
        "Writes layouts.md and layouts.json in --out, each run's report in "
        "round<R>-p<P>n<N>/. Instead of --partitions/--etl-processes.",
    ),
]

Rounds = Annotated[int, typer.Option(help="--layouts: rounds over all layouts.")]

ProducerMode = Annotated[
    str,
    typer.Option(
        help="process: each producer in its own process (default, disturbs the "
        "measurement least); inline: threads in the benchmark process."
    ),
]

BacklogDrain = Annotated[
    float,
    typer.Option(
        help="Scenario: take the ETL down for N s under load, then resume it and "
        "report the time until latency is back under --recovery-threshold. With "
        "--etl-processes > 1, process 0 goes down and the others go on."
    ),
]

DrainSignal = Annotated[
    str,
    typer.Option(
        help="term: SIGTERM and restart the ETL (it resumes from its commits); "
        "stop: SIGSTOP then SIGCONT."
    ),
]

RecoveryThreshold = Annotated[
    float, typer.Option(help="Backlog drain: 'recovered' once latency stays under this (s).")
]

Soak = Annotated[
    bool,
    typer.Option(
        help="Scenario: run lake maintenance (compact, checkpoint, vacuum with 24 h "
        "retention) every --maintenance-interval s and report latency per quarter."
    ),
]

MaintenanceInterval = Annotated[
    float | None,
    typer.Option(
        help="Soak: seconds between maintenance passes (default 60; with --soak-minutes "
        "the window length, each pass half-way through a window)."
    ),
]

SoakMinutes = Annotated[
    float,
    typer.Option(
        help="Scenario: a soak of this many minutes after the warm-up at one rate, with "
        "maintenance, reported per --window-minutes window (windows.json, windows.md, "
        "windows.png) with its goals; no per-message samples are kept.",
    ),
]

WindowMinutes = Annotated[float, typer.Option(help="--soak-minutes: length of a window (minutes).")]

VacuumRetentionHours = Annotated[
    int | None,
    typer.Option(
        help="Soak: vacuum removes files unreferenced for this many hours (whole hours, "
        ">= 1). Default: 24 h or 4 x the run, whichever is longer; a shorter one lets "
        "the object count level off within the run. The run's tables keep removed files in "
        "their log state as long (delta.deletedFileRetentionDuration)."
    ),
]

LogRetentionS = Annotated[
    int | None,
    typer.Option(
        help="Log retention of the run's tables in seconds (delta.logRetentionDuration; "
        "log files behind a checkpoint and older than this are cleaned up). Default: "
        "DELTABUS_LOG_RETENTION_S, and with --soak-minutes 600 s when that is not set."
    ),
]

RetentionS = Annotated[
    int | None,
    typer.Option(
        help="Soak: records' retention of the run's tables in seconds (a stream's retention_s, "
        "Kafka's retention.ms), applied by every maintenance pass to both input tables and "
        "the unified table. Default: records are kept."
    ),
]

Grace = Annotated[
    float,
    typer.Option(
        help="After producing ends, a message not seen once the consumer has made no "
        "progress for this many seconds is lost."
    ),
]

PollMs = Annotated[float, typer.Option(help="Consumer poll interval (ms).")]

EtlPollMs = Annotated[
    float | None, typer.Option(help="ETL input poll interval (ms); default: the ETL's own.")
]

Interval = Annotated[float, typer.Option(help="Bucket (s) of the latency-over-time plots.")]

IdleS = Annotated[
    float,
    typer.Option(
        help="After each Delta run, keep the ETL and consumer running without traffic for "
        "this many seconds and report their CPU and object-store requests (idle cost)."
    ),
]

Notify = Annotated[
    bool | None,
    typer.Option(
        "--notify/--no-notify",
        help="With --local-minio: MinIO pushes every commit to a `deltabus notify relay` "
        "(its webhook target) and tails wait on those events instead of polling; the "
        "relay's CPU is a component of its own. Default: on with --local-minio and the "
        "loopback store, off behind a store profile (S3 pushes no such events).",
    ),
]

Progress = Annotated[
    bool, typer.Option(help="Live progress on stderr (a terminal only; else log lines).")
]

Serve = Annotated[
    str | None,
    typer.Option(
        help="postgres or opensearch: also run that serving sink (`deltabus serve "
        "postgres|opensearch --follow`) and report the stage 'unified commit -> served', "
        "its verdict and CPU (the sink and the store's server). postgres: a message is "
        "served once visible in PostgreSQL; uses DELTABUS_POSTGRES_DSN (a fresh table), "
        "else a throwaway PostgreSQL on loopback. opensearch: once searchable in the "
        "index; uses DELTABUS_OPENSEARCH_URL (a fresh index, deleted afterwards), else a "
        "throwaway node on loopback (Java 17). The OpenSearch sink acknowledges a batch "
        "once searchable, so that stage takes about two to three refresh intervals. "
        "Delta backbone only."
    ),
]

ServeInFlight = Annotated[
    int | None,
    typer.Option(
        help="With --serve opensearch: batches the sink keeps in flight at once (1..16; "
        "default: the sink's, 4). 1 sends each batch after the last one became searchable."
    ),
]
ServeRefreshMs = Annotated[
    int | None,
    typer.Option(
        help="With --serve opensearch: the served index's refresh interval (ms, "
        "1..60000; default: the sink's, 200). Shorter makes documents searchable "
        "sooner at the cost of more segments and merges."
    ),
]

ServeReplay = Annotated[
    bool,
    typer.Option(
        help="With --serve: after each run, with nothing else running, a fresh sink "
        "(`deltabus serve <backend> --once`) loads the unified table's whole net content "
        "into a fresh table or index; reports its rows per second and the CPU of the "
        "sink and the store's server (the sink's standalone bulk rate)."
    ),
]

Etl = Annotated[
    str,
    typer.Option(
        help="The ETL between the tables: pathway (deltabus' ETL process), spark (the "
        "same transform as a Spark Structured Streaming job: Delta streaming source and "
        "sink, trigger processingTime = --profile; its JVM is the 'etl' CPU) or "
        "kafka-streams (the same transform as a Kafka Streams topology on the Kafka "
        "backbone: exactly_once_v2, commit.interval.ms = --profile; its JVM is the 'etl' "
        "CPU). Spark needs `make spark` once; it runs the Delta backbone on one partition "
        "only (no --partitions, --layouts, --backlog-drain, --soak, --soak-minutes, "
        "--idle-s). Kafka Streams needs `make kafka-jars` once; it runs with --backbone "
        "kafka only (no --partitions, --backlog-drain, --soak, --soak-minutes, --idle-s, "
        "--serve)."
    ),
]

Store = Annotated[
    str,
    typer.Option(
        help="Store profile: loopback (MinIO directly), s3-express (about 3-5 ms a "
        "request) or s3-standard (median about 27 ms, p99 about 180 ms: a per-request "
        "long tail). Producer, ETL, consumer and sinks reach MinIO through the "
        "profile's proxy; MinIO's metrics are read directly. Needs a plain-http MinIO; "
        "toxiproxy is built with Go on first use.",
    ),
]
