"""The `deltabus` application and its global options (settings file, prefix, JSON output,
health and metrics ports), shared by every command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deltabus.cli.state import state
from deltabus.core import metrics
from deltabus.core.logs import setup_logging

app = typer.Typer(
    help="Delta Lake tables on MinIO as a streaming backbone: produce, transform, export.\n\n"
    "Settings come from DELTABUS_* environment variables and an optional .env file "
    "(see README.md, Configuration).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
