"""What every `deltabus` command shares: the global options, the settings, the lake, and
how a report is printed.

Every command module, and a plugin's (`deltabus bench`), uses these without importing
the module that assembles the command line.
"""

from __future__ import annotations

import json
from pathlib import Path

from deltabus.core import health, metrics, retry
from deltabus.core.errors import ConfigError
from deltabus.core.settings import Settings, load_settings
from deltabus.delta.lake import Lake


class State:
    env_file: Path | None = None
    prefix: str | None = None
    as_json: bool = False
    health_port: int | None = None  # --health-port; wins over DELTABUS_HEALTH_PORT
    metrics_port: int | None = None  # --metrics-port; wins over DELTABUS_METRICS_PORT
    settings: Settings | None = None  # once loaded: names the lake in storage errors


state = State()


def settings() -> Settings:
    s = load_settings(state.env_file)
    if state.prefix is not None:
        try:
            s = s.with_prefix(state.prefix)
        except ConfigError as exc:
            raise ConfigError(f"--prefix: {exc.problem}", exc.hint) from None
    retry.configure(s.retry_max_wait_s)  # the budget may come from .env, not the environment
    state.settings = s
    port = state.health_port if state.health_port is not None else s.health_port
    if port is not None:  # from here on /healthz answers; /readyz once the command is ready
        health.serve(port)
    port = state.metrics_port if state.metrics_port is not None else s.metrics_port
    if port is not None:
        metrics.serve(port)
    return s


def lake(check: bool = True, write: bool = False) -> Lake:
    """The configured lake; `check` fails fast when it is unusable, `write` when read-only."""
    lk = Lake(settings())
    if check:
        lk.check(write=write)
    return lk


def emit(title: str, report: dict) -> None:
    """Print a report as JSON or as an aligned key/value block on stdout."""
    if state.as_json:
        print(json.dumps(report, default=str))
        return
    print(title)
    width = max(len(k) for k in report) if report else 0
    for key, value in report.items():
        print(f"  {key.ljust(width)}  {value}")


def print_value(value: object) -> None:
    """Print `value` as JSON: one line with --json, indented otherwise."""
    print(json.dumps(value, default=str, indent=None if state.as_json else 2))


def open_bus():  # noqa: ANN201 - deltabus.Bus, imported late to keep --help fast
    """The bus on the configured lake, checked writable."""
    from deltabus.bus.client import Bus

    return Bus(lake(write=True))
