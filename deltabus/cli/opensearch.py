"""`deltabus opensearch up|down`: a local OpenSearch node for development."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deltabus.cli.state import state
from deltabus.core.extras import needs_extra

DEFAULT_DATA_DIR = Path(".deltabus/opensearch")

opensearch_app = typer.Typer(
    help="A local OpenSearch node on loopback for development.", no_args_is_help=True
)


@opensearch_app.command("up")
@needs_extra("serve", "deltabus opensearch up")
def opensearch_up(
    data_dir: Annotated[
        Path, typer.Option(help="Where the node keeps its data, config and log.")
    ] = DEFAULT_DATA_DIR,
) -> None:
    """Start a local OpenSearch node on loopback for the index sink (Java 17; its jars
    are fetched with Maven into ~/.cache/deltabus once).

    Without DELTABUS_OPENSEARCH_URL, starts one on a free port of 9201-9299 and appends
    its URL to .env.
    """
    from deltabus.adapters.dev.opensearch import opensearch_up as up

    print(up(state.env_file, data_dir))


@opensearch_app.command("down")
@needs_extra("serve", "deltabus opensearch down")
def opensearch_down(
    data_dir: Annotated[Path, typer.Option(help="The data directory given to `up`.")] = (
        DEFAULT_DATA_DIR
    ),
) -> None:
    """Stop the local OpenSearch node started by `deltabus opensearch up`."""
    from deltabus.adapters.dev.opensearch import opensearch_down as down

    print(down(data_dir))
