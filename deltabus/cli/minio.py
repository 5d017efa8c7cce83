"""`deltabus minio build|up|down`: a local MinIO for development."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deltabus.cli.state import state
from deltabus.core.errors import ConfigError

minio_app = typer.Typer(
    help="A local MinIO server on loopback for development.", no_args_is_help=True
)


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
