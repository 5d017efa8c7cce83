"""`deltabus postgres up|down`: a local PostgreSQL for development."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deltabus.cli.state import state
from deltabus.core.extras import needs_extra

postgres_app = typer.Typer(
    help="A local PostgreSQL server on loopback for development.", no_args_is_help=True
)


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
