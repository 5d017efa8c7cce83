"""`deltabus serve postgres|opensearch`: keep a database equal to the unified stream,
exactly once. The database clients load when a command runs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from deltabus.cli.state import emit, lake, state
from deltabus.core import metrics
from deltabus.core.errors import ConfigError
from deltabus.core.extras import needs_extra
from deltabus.core.intervals import DEFAULT_POLL_INTERVAL_MS, from_ms

if TYPE_CHECKING:
    from deltabus.adapters.serving.sink_loop import ServeConfig
    from deltabus.delta.lake import Lake

serve_app = typer.Typer(
    help="Serve the unified stream in an operational database, exactly once.",
    no_args_is_help=True,
)

# Options both sinks take, with one meaning.
FollowOption = Annotated[
    bool,
    typer.Option(
        "--follow/--once",
        help="--follow: keep serving new commits until SIGTERM / Ctrl-C; --once: catch "
        "up to the unified version current at start, then stop.",
    ),
]
PollIntervalOption = Annotated[
    float, typer.Option(help="Poll timezone_unified for new versions this often (ms).")
]
ReadyFileOption = Annotated[
    Path | None, typer.Option(help="Create this file once the sink is following.")
]
LeaseTtlOption = Annotated[
    float,
    typer.Option(
        help="With --lease: an active replica not heard from for this long loses the "
        "lease to a standby (1 .. 600 s).",
    ),
]


def _lease_help(target: str, store: str) -> str:
    return (
        f"Run as one of several replicas of this sink (same {target}, same server): the "
        "replica holding the lease in the lake serves, the others stand by and take over "
        f"within the lease time when it dies, from the position stored in {store}. Needs "
        "--follow."
    )


@dataclass(frozen=True)
class Store:
    """What serving needs to know of a store's client module: the lease group's kind,
    how to name the store without its secret, how to sort its errors, and the report's
    count of what it holds."""

    kind: str
    client: ModuleType  # describe(url), user_error(exc, url), redact(text, url)
    held_key: str


def _serve_config(
    name: str, follow: bool, poll_interval_ms: float, max_versions: int, ready_file: Path | None
) -> ServeConfig:
    from deltabus.adapters.serving.sink_loop import ServeConfig

    if not 1 <= max_versions <= 10_000:
        raise ConfigError("--max-versions must be 1..10000")
    return ServeConfig(
        table=name,
        follow=follow,
        poll_interval=from_ms(poll_interval_ms, "poll interval"),
        max_versions_per_txn=max_versions,
        ready_file=ready_file,
    )


def _serve(
    store: Store,
    url: str,
    config: ServeConfig,
    lease: bool,
    lease_ttl_s: float,
    run: Callable[[Lake, threading.Event], dict],
) -> None:
    """Run one sink (`run(lake, stop)` returns its report) until done or SIGTERM / Ctrl-C,
    alone or as a lease replica, and print its report: a store's error is reported without
    its secret; `--once` adds the unified table's net row count beside the store's."""
    metrics.set_component(f"serve-{store.kind}")
    if lease and not config.follow:
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

            group = lease_group(store.kind, config.table, store.client.describe(url))
            report = SinkLease(lk, group, lease_ttl_s).run(stop, lambda until: run(lk, until))
        else:
            report = run(lk, stop)
    except Exception as exc:
        error = store.client.user_error(exc, url)
        if error is None:
            raise
        raise type(error)(store.client.redact(error.problem, url), error.hint) from None
    if not config.follow:  # what the store holds next to the unified table's net content
        from deltabus.adapters.serving.compare import unified_net_count

        items = list(report.items())
        at = [k for k, _ in items].index(store.held_key) + 1
        items.insert(at, ("unified_net_rows", unified_net_count(lk)))
        report = dict(items)
    emit("serve report", report)


def postgres_dsn(dsn: str | None) -> str:
    """--dsn, else DELTABUS_POSTGRES_DSN; a clear error when neither is set."""
    from deltabus.adapters.serving.settings import load_serving_settings

    configured = load_serving_settings(state.env_file).postgres_dsn
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
    follow: FollowOption = True,
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
    poll_interval_ms: PollIntervalOption = DEFAULT_POLL_INTERVAL_MS,
    max_versions: Annotated[
        int, typer.Option(help="At most this many unified versions per transaction.")
    ] = 50,
    ready_file: ReadyFileOption = None,
    lease: Annotated[
        bool, typer.Option("--lease", help=_lease_help("--table", "PostgreSQL"))
    ] = False,
    lease_ttl_s: LeaseTtlOption = 10.0,
) -> None:
    """Keep a PostgreSQL table equal to timezone_unified's net content, exactly once.

    Retractions delete rows, insertions upsert them (key: message); the sink's position
    (the unified version applied) commits in the same transaction as the rows.
    """
    from deltabus.adapters.serving import pg
    from deltabus.adapters.serving.postgres_sink import PostgresSink
    from deltabus.adapters.serving.postgres_target import check_table_name

    config = _serve_config(
        check_table_name(table), follow, poll_interval_ms, max_versions, ready_file
    )
    url = postgres_dsn(dsn)
    pg.parse(url)
    _serve(
        Store("postgres", pg, "served_rows"),
        url,
        config,
        lease,
        lease_ttl_s,
        lambda lk, until: PostgresSink(lk, url, config, until).run().as_dict(),
    )


def opensearch_url(url: str | None) -> str:
    """--url, else DELTABUS_OPENSEARCH_URL; a clear error when neither is set."""
    from deltabus.adapters.serving.settings import load_serving_settings

    if url:
        return url
    configured = load_serving_settings(state.env_file).opensearch_url
    if configured is None:
        raise ConfigError(
            "no OpenSearch configured for the index sink",
            "set DELTABUS_OPENSEARCH_URL (http://HOST:PORT or https://USER:PASSWORD@HOST:PORT), "
            "or start a local node with `deltabus opensearch up`",
        )
    return configured.get_secret_value()


@serve_app.command("opensearch")
@needs_extra("serve", "deltabus serve opensearch")
def serve_opensearch(
    follow: FollowOption = True,
    url: Annotated[
        str | None,
        typer.Option(
            help="OpenSearch URL; default DELTABUS_OPENSEARCH_URL (prefer it: a password on "
            "a command line is visible to other users of the machine)."
        ),
    ] = None,
    index: Annotated[str, typer.Option(help="The served index (created when missing).")] = (
        "indexed_unified"
    ),
    poll_interval_ms: PollIntervalOption = DEFAULT_POLL_INTERVAL_MS,
    max_versions: Annotated[
        int, typer.Option(help="At most this many unified versions per batch.")
    ] = 50,
    refresh_interval_ms: Annotated[
        int,
        typer.Option(
            help="The index's refresh interval (ms): a batch is acknowledged once searchable, "
            "so this bounds its wait; shorter costs more segments and merges.",
        ),
    ] = 200,
    in_flight: Annotated[
        int,
        typer.Option(
            help="Batches whose bulk requests are in flight at once (1..16); the position "
            "still moves batch by batch, in order. 1 sends each batch only after the last "
            "one became searchable.",
        ),
    ] = 4,
    ready_file: ReadyFileOption = None,
    lease: Annotated[
        bool, typer.Option("--lease", help=_lease_help("--index", "OpenSearch"))
    ] = False,
    lease_ttl_s: LeaseTtlOption = 10.0,
) -> None:
    """Keep an OpenSearch index equal to timezone_unified's net content, exactly once.

    One document per message (_id: the message); retractions delete, insertions index;
    each write carries the unified version as its external version, and the sink's
    position is a document of deltabus_sink_position.
    """
    from deltabus.adapters.serving import opensearch_connection as osc
    from deltabus.adapters.serving.opensearch import OpenSearchSink
    from deltabus.adapters.serving.opensearch_documents import check_index_name

    if not 1 <= refresh_interval_ms <= 60_000:
        raise ConfigError("--refresh-interval-ms must be 1..60000")
    if not 1 <= in_flight <= 16:
        raise ConfigError("--in-flight must be 1..16")
    config = _serve_config(
        check_index_name(index), follow, poll_interval_ms, max_versions, ready_file
    )
    target_url = opensearch_url(url)
    osc.parse(target_url)
    _serve(
        Store("opensearch", osc, "indexed_docs"),
        target_url,
        config,
        lease,
        lease_ttl_s,
        lambda lk, until: (
            OpenSearchSink(lk, target_url, config, until, refresh_interval_ms, in_flight)
            .run()
            .as_dict()
        ),
    )
