"""`deltabus`: the command line of the engine (works without Dagster), one module per
command group; `main` is the entry point."""

from deltabus.cli.main import app, main

__all__ = ["app", "main"]
