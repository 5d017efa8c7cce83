"""`deltabus`: the command line of the engine (works without Dagster)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from deltabus.adapters.cli_state import emit, lake, state
from deltabus.adapters.serving.opensearch_cli import opensearch_app, serve_opensearch
from deltabus.adapters.streams_cli import consume_stream, groups_app, produce_stream, streams_app
from deltabus.core import metrics
from deltabus.core.errors import ConfigError, user_storage_error
from deltabus.core.extras import needs_extra
from deltabus.core.intervals import DEFAULT_COMMIT_INTERVAL_MS, DEFAULT_POLL_INTERVAL_MS, from_ms
from deltabus.core.logs import setup_logging
from deltabus.core.processes import apply_process_defaults

log = logging.getLogger("deltabus")

app = typer.Typer(
    help="Delta Lake tables on MinIO as a streaming backbone: produce, transform, export.\n\n"
    "Settings come from DELTABUS_* environment variables and an optional .env file "
    "(see README.md, Configuration).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
minio_app = typer.Typer(
    help="A local MinIO server on loopback for development.", no_args_is_help=True
)
app.add_typer(minio_app, name="minio")
app.add_typer(streams_app, name="streams")
app.add_typer(groups_app, name="groups")


def _print_version(value: bool) -> None:
    if value:
        from deltabus.core.version import installed_version

        print(f"deltabus {installed_version()}")
        raise typer.Exit()


# The `component` label of a command's metrics (deltabus.core.metrics).
COMPONENTS = {"produce": "producer", "consume": "consumer"}


@app.callback()
def _global(
    ctx: typer.Context,
    env_file: Annotated[
        Path | None,
        typer.Option(help="Settings file (KEY=value lines); default ./.env if present."),
    ] = None,
    prefix: Annotated[
        str | None, typer.Option(help="Lake prefix to use instead of DELTABUS_PREFIX.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print reports as JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the installed version and exit.",
        ),
    ] = False,
    health_port: Annotated[
        int | None,
        typer.Option(
            help="Serve GET /healthz and /readyz on 0.0.0.0 at this port (probes); "
            "default DELTABUS_HEALTH_PORT, else none.",
            min=1,
            max=65535,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics (GET /metrics) on 0.0.0.0 at this port; may be "
            "the health port; default DELTABUS_METRICS_PORT, else none "
            "(docs/reference/metrics.md).",
            min=1,
            max=65535,
        ),
    ] = None,
) -> None:
    setup_logging(verbose)
    state.env_file, state.prefix, state.as_json = env_file, prefix, as_json
    state.health_port = health_port
    state.metrics_port = metrics_port
    if ctx.invoked_subcommand:
        metrics.set_component(COMPONENTS.get(ctx.invoked_subcommand, ctx.invoked_subcommand))


def parse_instant_us(text: str) -> int:
    """An ISO-8601 instant with a zone (Z or +hh:mm) as epoch microseconds."""
    from datetime import datetime

    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"--start-at {text!r} is not an ISO-8601 instant", "e.g. 2026-03-08T06:59:55Z"
        ) from None
    if instant.tzinfo is None:
        raise ConfigError(f"--start-at {text!r} has no time zone", "add Z or +hh:mm")
    return int(instant.timestamp() * 1_000_000)


def check_output(out: Path) -> None:
    """Fail before any work, with one clear message, when `--out` cannot be written."""
    import tempfile

    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory", "give a file path, e.g. results.csv")
    parent = next(p for p in [out.parent, *out.parent.parents, Path(".")] if p.exists())
    if not parent.is_dir():
        raise ConfigError(f"--out {out}: {parent} is not a directory", "choose another --out")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".deltabus-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--out {out}: cannot write in {parent.absolute()}: {exc.strerror or exc}",
            "choose a writable path for --out",
        ) from None


@app.command("init-bucket")
def init_bucket() -> None:
    """Create the configured bucket on MinIO (no-op when it exists)."""
    lk = lake(check=False)
    created = lk.init_bucket()
    lk.check(write=True)
    s = lk.settings
    print(f"bucket '{s.bucket}' {'created' if created else 'exists'} at {s.describe()}")


@app.command("check")
def check() -> None:
    """Check that the lake is reachable and writable with the configured settings."""
    lk = lake(write=True)
    print(f"ok: {lk.settings.describe()}")


# Shared by `produce` and `etl`: both may be the first to record a lake's layout.
PartitionsOption = Annotated[
    int | None,
    typer.Option(
        help="Partitions per stream (1..64): each a Delta table of its own "
        "(timezone1-p0 ...). Default: what the lake records (1 for a new lake). A lake "
        "keeps the number it was first written with.",
    ),
]


@app.command()
def produce(
    rate: Annotated[float, typer.Option(help="Messages per second (open-loop schedule).")] = 10_000,
    duration: Annotated[
        float | None, typer.Option(help="Seconds to produce for (or give --count).")
    ] = None,
    count: Annotated[
        int | None, typer.Option(help="Number of messages (or give --duration).")
    ] = None,
    commit_interval_ms: Annotated[
        float, typer.Option(help="One commit per table per interval (1 .. 60000 ms).")
    ] = DEFAULT_COMMIT_INTERVAL_MS,
    seed: Annotated[int, typer.Option(help="Seed for the table each message goes to.")] = 0,
    start_at: Annotated[
        str | None,
        typer.Option(
            help="Schedule from this ISO instant (e.g. 2026-03-08T06:59:55Z) instead of now; "
            "past schedules are sent at once."
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            help="Run id (lower-case letters, digits, '_', '-', '.'); rerun with the same "
            "id to resume without duplicates."
        ),
    ] = None,
    partitions: PartitionsOption = None,
    stream: Annotated[
        str | None,
        typer.Option(
            help="Send JSON lines from stdin to this declared stream instead (deltabus "
            "streams create); only --producer-id and --commit-interval-ms apply then."
        ),
    ] = None,
    producer_id: Annotated[
        str | None,
        typer.Option(
            help="With --stream: the producer's stable name. Run again with the same id "
            "and input to send what was not committed, exactly once (default: a new id)."
        ),
    ] = None,
) -> None:
    """Write messages from New York and Paris into timezone1 and timezone2 (or their
    partitions: each commit window's messages go to one partition, the next window's to
    the next; a window of more than 65,536 messages is cut into chunks that go on in turn).
    With --stream, send one JSON object per stdin line to a stream of your own."""
    if stream is not None:
        produce_stream(stream, producer_id, commit_interval_ms, sys.stdin)
        return
    with needs_extra("pathway", "deltabus produce without --stream (the time-zone producer)"):
        from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer

    if duration is None and count is None:
        duration = 10.0
    extra = {"run_id": run_id} if run_id else {}
    config = ProducerConfig(
        rate=rate,
        duration=duration,
        count=count,
        commit_interval=from_ms(commit_interval_ms),
        seed=seed,
        start_us=parse_instant_us(start_at) if start_at else None,
        partitions=partitions,
        **extra,
    )
    lk = lake(write=True)
    log.info(
        "producing %d messages at %.0f msg/s to %s (run %s)",
        config.total,
        config.rate,
        lk.settings.describe(),
        config.run_id,
    )
    report = TimezoneProducer(lk, config).run(
        on_progress=lambda p: log.info(
            "produced %d/%d messages, %.3fs behind schedule", p["messages"], p["total"], p["lag_s"]
        )
    )
    emit("producer report", report.as_dict())


class Start(StrEnum):
    beginning = "beginning"
    end = "end"


class OffsetReset(StrEnum):
    earliest = "earliest"
    latest = "latest"
    error = "error"


@app.command()
def consume(
    stream: Annotated[list[str], typer.Option(help="Declared stream to read (repeatable).")],
    group: Annotated[str, typer.Option(help="Consumer group: its members share the partitions.")],
    start: Annotated[
        Start, typer.Option(help="Where a group that never read a partition starts.")
    ] = Start.beginning,
    max_records: Annotated[
        int | None,
        typer.Option(help="Stop after the batch that reaches this many records."),
    ] = None,
    idle_exit_s: Annotated[
        float | None,
        typer.Option(help="Stop after this many seconds without a new record."),
    ] = None,
    auto_offset_reset: Annotated[
        OffsetReset,
        typer.Option(
            help="When the group's position fell behind the stream's retention (Kafka's "
            "auto.offset.reset): go on from what lands next (latest, Kafka's default), "
            "from the oldest version kept (earliest), both with a warning on stderr, or "
            "stop with exit status 2 (error)."
        ),
    ] = OffsetReset.latest,
) -> None:
    """Write a stream's records to stdout as JSON lines (its columns, diff: +1 or -1 for a
    record another writer deleted, _stream, _partition, _version), as a member of a
    consumer group; the group's position is committed after each batch is written."""
    consume_stream(stream, group, start.value, max_records, idle_exit_s, auto_offset_reset.value)


class EtlMode(StrEnum):
    bounded = "bounded"
    continuous = "continuous"


class CorruptFileAction(StrEnum):
    stop = "stop"
    skip = "skip"


class LeaseChildren(StrEnum):
    per_partition = "per-partition"
    per_set = "per-set"
    per_batch = "per-batch"


@app.command()
@needs_extra("pathway", "deltabus etl")
def etl(
    mode: Annotated[
        EtlMode,
        typer.Option(
            help="bounded: stop when the inputs are finished; continuous: run until stopped."
        ),
    ] = EtlMode.bounded,
    commit_interval_ms: Annotated[
        float, typer.Option(help="Commit the unified table this often (1 .. 60000 ms).")
    ] = DEFAULT_COMMIT_INTERVAL_MS,
    poll_interval_ms: Annotated[
        float, typer.Option(help="Poll the inputs for new versions this often (1 .. 60000 ms).")
    ] = DEFAULT_POLL_INTERVAL_MS,
    producers: Annotated[
        int, typer.Option(help="Bounded mode: finished producer runs to wait for per table.")
    ] = 1,
    until_run: Annotated[
        list[str] | None,
        typer.Option(
            help="Bounded mode: stop once this producer run (repeatable) has finished in both "
            "inputs, whatever runs the tables finished before; replaces --producers.",
        ),
    ] = None,
    ready_file: Annotated[
        Path | None, typer.Option(help="Create this file once the dataflow is running.")
    ] = None,
    threads: Annotated[int, typer.Option(help="Pathway worker threads.")] = 1,
    process: Annotated[
        int,
        typer.Option(
            help="This ETL's index among --processes: it owns partitions i with "
            "i mod processes == process (like a consumer group member).",
        ),
    ] = 0,
    processes: Annotated[
        int, typer.Option(help="ETL processes sharing the partitions (1..P).")
    ] = 1,
    partitions: PartitionsOption = None,
    lease: Annotated[
        bool,
        typer.Option(
            "--lease",
            help="Continuous mode: share the partitions with the lake's other --lease ETLs "
            "by leases in the lake (consumer group etl.timezone_unified), with no "
            "--process/--processes: take free partitions, hand some over when a replica "
            "joins, take a dead one's within the lease time. Runs the ETL of the "
            "partitions it holds as child processes, each its own single-machine Pathway "
            "program. SIGTERM leaves the group at once.",
        ),
    ] = False,
    lease_ttl_s: Annotated[
        float,
        typer.Option(
            help="With --lease: the lease time. A replica not heard from for this long "
            "loses its partitions to the others (1 .. 600 s).",
        ),
    ] = 10.0,
    lease_children: Annotated[
        LeaseChildren,
        typer.Option(
            help="With --lease: one ETL child per batch of partitions taken together (a "
            "child that must give one up restarts with the rest), one per partition, or one "
            "for the whole held set (restarted whenever the set changes).",
        ),
    ] = LeaseChildren.per_batch,
    lease_spare: Annotated[
        bool,
        typer.Option(
            help="With --lease: keep a spare ETL child waiting with Pathway loaded, so a "
            "partition taken over starts processing without Pathway's start-up time.",
        ),
    ] = True,
    partition_list: Annotated[
        str | None,
        typer.Option(
            help="Run exactly these partitions (comma-separated indices, e.g. 0,2) instead "
            "of --process/--processes; '-': read them as one line from stdin once Pathway "
            "is loaded (a --lease ETL's spare child).",
        ),
    ] = None,
    parent_pid: Annotated[int | None, typer.Option(hidden=True)] = None,
    on_corrupt_file: Annotated[
        CorruptFileAction | None,
        typer.Option(
            help="An input data file that cannot be read as Parquet (corrupt, truncated): "
            "stop (exit 2 naming the table, version and file; nothing of that version is "
            "written, positions stay) or skip it (logged, counted as skipped_files in the "
            "report; its rows never reach timezone_unified). Default: "
            "DELTABUS_ON_CORRUPT_FILE, else stop.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the Pathway ETL: tail both inputs, parse dates, write timezone_unified."""
    from deltabus.apps.timezones.etl.config import EtlConfig
    from deltabus.core.pipes import report_to_dagster

    only = None
    if lease or partition_list is not None:
        from deltabus.adapters.etl_lease import SPARE, follow_parent, parse_partition_list

        given = "--lease" if lease else "--partition-list"
        if process != 0 or processes != 1:
            raise ConfigError(
                f"{given} and --process/--processes both say which partitions to run",
                f"give one of them: {given}, or --process and --processes",
            )
        if lease and mode is not EtlMode.continuous:
            raise ConfigError(
                "--lease runs until stopped: it needs --mode continuous",
                "add --mode continuous, or run a bounded ETL without --lease",
            )
        if lease and partition_list is not None:
            raise ConfigError("--lease decides the partitions itself", "leave out --partition-list")
        if partition_list is not None and partition_list != SPARE:
            only = parse_partition_list(partition_list)
        if parent_pid is not None:
            follow_parent(parent_pid)
    config = EtlConfig(
        bounded=mode is EtlMode.bounded,
        commit_interval=from_ms(commit_interval_ms),
        poll_interval=from_ms(poll_interval_ms, "poll interval"),
        expected_producers=producers,
        until_runs=frozenset(until_run or ()),
        threads=threads,
        process=process,
        processes=processes,
        partitions=partitions,
        only=only,
        on_corrupt_file=on_corrupt_file.value if on_corrupt_file else None,
    )
    if lease:
        from deltabus.adapters.etl_lease import LeaseConfig, lease_etl

        lease_config = LeaseConfig(lease_ttl_s, lease_children.value, lease_spare)
        child_args = [
            *("--commit-interval-ms", str(commit_interval_ms)),
            *("--poll-interval-ms", str(poll_interval_ms), "--threads", str(threads)),
            *(["--on-corrupt-file", on_corrupt_file.value] if on_corrupt_file else []),
        ]
        emit(
            "ETL lease report",
            lease_etl(lake(write=True), config, child_args, lease_config, ready_file),
        )
        return
    from deltabus.apps.timezones.etl.pipeline import run_etl

    lk = lake(write=True)
    if partition_list == "-":  # a spare: Pathway is loaded now, the partitions come next
        from dataclasses import replace

        from deltabus.adapters.etl_lease import await_partitions

        given = await_partitions(ready_file)
        if given is None:
            return  # dismissed before it had partitions
        config = replace(config, only=given)
    report = run_etl(lk, config, ready_file=ready_file)
    emit("ETL report", report.as_dict())
    report_to_dagster(
        {
            "rows": report.rows,
            "rejected_rows": report.rejected,
            "delta_version": report.unified_version,
            "commits": report.commits,
            "elapsed_s": report.elapsed_s,
            "throughput_rows_s": report.throughput_rows_s,
        },
        asset_key="timezone_unified",
    )


@app.command("link", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def link(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The link's name, as its program names its Link.")],
    target: Annotated[
        str, typer.Option(help="The declared stream the link writes: its partitions are shared.")
    ],
    lease_ttl_s: Annotated[
        float,
        typer.Option(
            help="The lease time. A replica not heard from for this long loses its "
            "partitions to the others (1 .. 600 s).",
        ),
    ] = 10.0,
    ready_file: Annotated[
        Path | None, typer.Option(help="Create this file once the replica has joined its group.")
    ] = None,
) -> None:
    """Run a Pathway link program (the command after --) as one of several replicas that
    share the link's partitions by leases in the lake (group link.NAME).

    The program runs as a child for the partitions held (`Link` reads them from
    DELTABUS_LINK and DELTABUS_LINK_PARTITIONS) and restarts when they change. Example:
    deltabus link eur --target orders_eur -- python eur.py
    """
    from deltabus.adapters.link_lease import lease_link

    metrics.set_component("link-lease")
    command = [a for a in ctx.args if a != "--"] if ctx.args[:1] == ["--"] else list(ctx.args)
    emit(
        "link lease report",
        lease_link(lake(write=True), name, target, command, lease_ttl_s, ready_file),
    )


@app.command()
@needs_extra("pathway", "deltabus results")
def results(
    out: Annotated[Path, typer.Option(help="CSV file to write.")] = Path("results.csv"),
    net: Annotated[
        bool,
        typer.Option(
            help="Only the current content (retracted rows left out) instead of the changelog."
        ),
    ] = False,
) -> None:
    """Export timezone_unified as CSV (timestamp,message,time,diff), ordered by time.

    By default the changelog: a row with diff -1 retracts an earlier row (an input deleted
    or updated it). With --net, the net content only.
    """
    from deltabus.apps.timezones.results import export_results

    check_output(out)
    rows = export_results(lake(), out, net=net)
    print(f"wrote {rows} rows to {out}")


@app.command()
@needs_extra("pathway", "deltabus demo")
def demo(
    rate: Annotated[float, typer.Option(help="Messages per second.")] = 10_000,
    duration: Annotated[float, typer.Option(help="Seconds to produce for.")] = 10,
    out: Annotated[Path, typer.Option(help="CSV file for the results.")] = Path("results.csv"),
) -> None:
    """Run the whole flow once, without Dagster: ETL process + producer + CSV export."""
    from deltabus.adapters.demo import run_demo

    emit("demo summary", run_demo(lake(write=True), rate=rate, duration=duration, out=out))


@minio_app.command("build")
def minio_build() -> None:
    """Build the pinned MinIO with `go install` into the cache (once)."""
    from deltabus.adapters.dev.minio_process import build_minio

    print(build_minio())


@minio_app.command("up")
def minio_up(
    data_dir: Annotated[Path, typer.Option(help="Where MinIO keeps its data.")] = Path(
        ".deltabus/minio"
    ),
    nodes: Annotated[
        int,
        typer.Option(
            help="1: a single server. 4 to 16: distributed, erasure-coded MinIO (MinIO's"
            " minimum is 4 nodes), 2 drives a node, node i on the endpoint's port + i;"
            " 4 nodes (8 drives, EC:4) keep reading and writing with one node down."
        ),
    ] = 1,
    notify: Annotated[
        bool,
        typer.Option(
            "--notify",
            help="Also start a notify relay and have MinIO push each commit to it, so tails"
            " wait on events instead of polling (single server only); writes"
            " DELTABUS_NOTIFY and DELTABUS_NOTIFY_URL to .env.",
        ),
    ] = False,
    relay_port: Annotated[
        int, typer.Option(help="The relay's loopback port (with --notify).", min=1, max=65535)
    ] = 9100,
) -> None:
    """Start a local MinIO for the configured endpoint (loopback only), with its bucket.

    Creates .env with a random secret key when no secret is configured yet.
    """
    from deltabus.adapters.dev.cluster import check_nodes, cluster_up
    from deltabus.adapters.dev.server import minio_up as up
    from deltabus.core.errors import ConfigError

    check_nodes(nodes)
    if notify and nodes != 1:
        raise ConfigError(
            "--notify works with a single MinIO server",
            "drop --nodes, or configure the webhook target on each node yourself "
            "(docs/design/tailing.md, commit notifications)",
        )
    if nodes == 1:
        print(up(state.env_file, data_dir, notify=notify, relay_port=relay_port))
    else:
        print(cluster_up(state.env_file, data_dir, nodes))


@minio_app.command("down")
def minio_down(
    data_dir: Annotated[Path, typer.Option(help="The data directory given to `up`.")] = Path(
        ".deltabus/minio"
    ),
) -> None:
    """Stop the local MinIO (all nodes of a distributed one) started by `deltabus minio up`,
    and its notify relay."""
    from deltabus.adapters.dev.cluster import minio_down as down

    print(down(data_dir))


notify_app = typer.Typer(
    help="Commit notifications: MinIO pushes each commit to a relay, tails wait on it "
    "instead of polling (DELTABUS_NOTIFY=true, DELTABUS_NOTIFY_URL=http://<relay>/events).",
    no_args_is_help=True,
)
app.add_typer(notify_app, name="notify")


@notify_app.command("relay")
def notify_relay(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 9100,
    token_env: Annotated[
        str | None,
        typer.Option(
            help="Name of an environment variable holding the bearer token MinIO sends "
            "(MINIO_NOTIFY_WEBHOOK_AUTH_TOKEN_DELTABUS); unset: no token required."
        ),
    ] = None,
) -> None:
    """Run the relay: MinIO's webhook target POSTs events to /minio, tailing processes
    stream them from /events. Runs until interrupted."""
    import os

    from deltabus.bus.notify_relay import NotifyRelay
    from deltabus.core.errors import ConfigError

    token = os.environ.get(token_env) if token_env else None
    if token_env and not token:
        raise ConfigError(f"--token-env {token_env}: that variable is not set")
    try:
        relay = NotifyRelay(host, port, token)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}", "choose --port"
        ) from None

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # Set explicitly, and before the line that says the relay runs: a process started
    # with SIGTERM ignored would otherwise never stop.
    signal.signal(signal.SIGTERM, interrupt)
    try:  # a SIGTERM right after the line is printed stops the relay cleanly too
        print(
            f"relay on {relay.url}: MinIO posts to {relay.url}/minio, "
            f"tails read {relay.url}/events",
            flush=True,
        )
        relay.serve_forever()
    except KeyboardInterrupt:
        pass


@notify_app.command("subscribe")
def notify_subscribe() -> None:
    """Send the lake's commit events (.json objects created under the prefix) to the
    relay: sets the bucket's notification configuration to MinIO's DELTABUS webhook target."""
    from deltabus.bus.notify_relay import subscribe

    lk = lake()
    arn = subscribe(lk)
    print(f"commit events of bucket {lk.settings.bucket} go to {arn}")


serve_app = typer.Typer(
    help="Serve the unified stream in an operational database, exactly once.",
    no_args_is_help=True,
)
app.add_typer(serve_app, name="serve")
postgres_app = typer.Typer(
    help="A local PostgreSQL server on loopback for development.", no_args_is_help=True
)
app.add_typer(postgres_app, name="postgres")
app.add_typer(opensearch_app, name="opensearch")
serve_app.command("opensearch")(needs_extra("serve", "deltabus serve opensearch")(serve_opensearch))


def postgres_dsn(dsn: str | None) -> str:
    """--dsn, else DELTABUS_POSTGRES_DSN; a clear error when neither is set."""
    from deltabus.adapters.cli_state import settings as load

    configured = load().postgres_dsn
    if dsn:
        return dsn
    if configured is None:
        raise ConfigError(
            "no PostgreSQL configured for the serving sink",
            "set DELTABUS_POSTGRES_DSN (postgresql://USER:PASSWORD@HOST:PORT/DATABASE), or "
            "start a local one with `deltabus postgres up` (make postgres)",
        )
    return configured.get_secret_value()


@serve_app.command("postgres")
@needs_extra("serve", "deltabus serve postgres")
def serve_postgres(
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--once",
            help="--follow: keep serving new commits until SIGTERM / Ctrl-C; --once: catch "
            "up to the unified version current at start, then stop.",
        ),
    ] = True,
    dsn: Annotated[
        str | None,
        typer.Option(
            help="libpq connection string; default DELTABUS_POSTGRES_DSN (prefer it: a "
            "password on a command line is visible to other users of the machine)."
        ),
    ] = None,
    table: Annotated[str, typer.Option(help="The served table (created when missing).")] = (
        "served_unified"
    ),
    poll_interval_ms: Annotated[
        float, typer.Option(help="Poll timezone_unified for new versions this often (ms).")
    ] = DEFAULT_POLL_INTERVAL_MS,
    max_versions: Annotated[
        int, typer.Option(help="At most this many unified versions per transaction.")
    ] = 50,
    ready_file: Annotated[
        Path | None, typer.Option(help="Create this file once the sink is following.")
    ] = None,
    lease: Annotated[
        bool,
        typer.Option(
            "--lease",
            help="Run as one of several replicas of this sink (same --table, same server): "
            "the replica holding the lease in the lake serves, the others stand by and take "
            "over within the lease time when it dies, from the position stored in "
            "PostgreSQL. Needs --follow.",
        ),
    ] = False,
    lease_ttl_s: Annotated[
        float,
        typer.Option(
            help="With --lease: an active replica not heard from for this long loses the "
            "lease to a standby (1 .. 600 s).",
        ),
    ] = 10.0,
) -> None:
    """Keep a PostgreSQL table equal to timezone_unified's net content, exactly once.

    Retractions delete rows, insertions upsert them (key: message); the sink's position
    (the unified version applied) commits in the same transaction as the rows.
    """
    import threading

    from deltabus.adapters.serving import pg
    from deltabus.adapters.serving.postgres_sink import PostgresSink, ServeConfig

    metrics.set_component("serve-postgres")
    from deltabus.adapters.serving.postgres_target import check_table_name

    if not 1 <= max_versions <= 10_000:
        raise ConfigError("--max-versions must be 1..10000")
    config = ServeConfig(
        table=check_table_name(table),
        follow=follow,
        poll_interval=from_ms(poll_interval_ms, "poll interval"),
        max_versions_per_txn=max_versions,
        ready_file=ready_file,
    )
    url = postgres_dsn(dsn)
    pg.parse(url)
    if lease and not follow:
        raise ConfigError(
            "--lease runs until stopped: it needs --follow",
            "leave out --once, or run a catch-up sink without --lease",
        )
    lk = lake(write=lease)  # a replica writes its heartbeat and lease to the lake
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if lease:
            from deltabus.adapters.serving.sink_lease import SinkLease, lease_group

            group = lease_group("postgres", config.table, pg.describe(url))
            report = SinkLease(lk, group, lease_ttl_s).run(
                stop, lambda serving: PostgresSink(lk, url, config, serving).run().as_dict()
            )
        else:
            report = PostgresSink(lk, url, config, stop).run().as_dict()
    except Exception as exc:
        error = pg.user_error(exc, url)
        if error is None:
            raise
        raise type(error)(pg.redact(error.problem, url), error.hint) from None
    if not follow:  # the served row count next to the unified table's net content
        from deltabus.adapters.serving.compare import unified_net_count

        items = list(report.items())
        at = [k for k, _ in items].index("served_rows") + 1
        items.insert(at, ("unified_net_rows", unified_net_count(lk)))
        report = dict(items)
    emit("serve report", report)


@postgres_app.command("up")
@needs_extra("serve", "deltabus postgres up")
def postgres_up(
    data_dir: Annotated[Path, typer.Option(help="Where PostgreSQL keeps its data.")] = Path(
        ".deltabus/postgres"
    ),
) -> None:
    """Start a local PostgreSQL on loopback for the serving sink.

    Without DELTABUS_POSTGRES_DSN, initialises one with a random password and appends its
    DSN to .env (mode 600).
    """
    from deltabus.adapters.dev.postgres import postgres_up as up

    print(up(state.env_file, data_dir))


@postgres_app.command("down")
@needs_extra("serve", "deltabus postgres down")
def postgres_down(
    data_dir: Annotated[Path, typer.Option(help="The data directory given to `up`.")] = Path(
        ".deltabus/postgres"
    ),
) -> None:
    """Stop the local PostgreSQL started by `deltabus postgres up`."""
    from deltabus.adapters.dev.postgres import postgres_down as down

    print(down(data_dir))


# Commands of packages that live beside the engine, added when they are importable. The
# repository's benchmark (`deltabus_bench/`, not in the wheel) adds `bench` and
# `store-check` this way, so the engine never imports it (docs/adr/0049-benchmark-package.md).
COMMAND_PLUGINS = {"deltabus_bench.command": ("bench", "store-check")}


def _absent_plugin_command(name: str, module: str) -> None:
    """Register `name` as a command that says where the absent plugin comes from."""
    package = module.partition(".")[0]

    @app.command(
        name,
        hidden=True,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def absent() -> None:
        raise ConfigError(
            f"deltabus {name}: the benchmark ({package}) is not installed; it is not part of "
            "the deltabus package",
            "run it from a checkout of the deltabus repository: `make venv`, then "
            f"`.venv/bin/deltabus {name} --help`",
        )


def _add_plugin_commands() -> None:
    for module, commands in COMMAND_PLUGINS.items():
        if importlib.util.find_spec(module.partition(".")[0]) is not None:
            importlib.import_module(module).register(app)
        else:
            for name in commands:
                _absent_plugin_command(name, module)


_add_plugin_commands()


_terminated: list[int] = []  # the signal that ended the command, if SIGTERM did


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM raises KeyboardInterrupt where the main thread is, so that cleanups run
    as on Ctrl-C (the command line may wrap it on its way up: the signal is noted)."""
    _terminated.append(signum)
    raise KeyboardInterrupt


def main() -> None:
    """Entry point: user-fixable problems print one clear message and exit with status 2.
    SIGTERM stops a command as Ctrl-C does (its child processes are stopped too), unless
    the command stops gracefully on it by itself."""
    apply_process_defaults()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except SystemExit as exc:
        if _terminated and exc.code == 130:  # the command line's own answer to Ctrl-C
            print("deltabus: terminated", file=sys.stderr)
            sys.exit(128 + signal.SIGTERM)
        raise
    except KeyboardInterrupt:
        terminated = bool(_terminated)
        print(f"deltabus: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM if terminated else 130)
    except Exception as exc:
        # A storage failure the user must fix (read-only or full lake, access denied) may
        # surface from delta-rs, boto3 or Pathway anywhere in a command: find it in the
        # exception chain. Anything else is a bug, and keeps its traceback.
        s = state.settings
        error = user_storage_error(exc, s.describe() if s else "")
        if error is None:
            raise
        kind = "configuration error" if isinstance(error, ConfigError) else "error"
        text = f"deltabus: {kind}: {error}"
        secrets = [s.secret_key, s.session_token] if s else []
        for secret in (v.get_secret_value() for v in secrets if v is not None):
            text = text.replace(secret, "***")
        print(text, file=sys.stderr)
        # Leave without interpreter teardown: after a failed Pathway run its native
        # threads can crash during it (SIGSEGV), which would hide this exit status.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)


if __name__ == "__main__":
    main()
