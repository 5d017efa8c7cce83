"""Benchmark workloads as data: `deltabus bench --workload FILE` reads its options from a
YAML file, so a published figure names a file instead of a command line.

A workload file is a mapping of `deltabus bench` option names (as on the command line,
`-` or `_` alike, without the leading dashes) to values, plus an optional free-text
`description`. Options given on the command line win over the file's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
import yaml

from deltabus.core.errors import ConfigError

DESCRIPTION = "description"  # free text: what the workload measures, and why


def load_workload(path: Path, options: Mapping[str, object]) -> dict[str, Any]:
    """The option values a workload file sets.

    Args:
        path: the YAML file.
        options: the command's options by parameter name (`rates`, `local_minio`, ...).

    Returns:
        {parameter name: value}, ready for click's `default_map`: a list becomes the
        comma-separated string the command line takes (`rates: [10000, 30000]` ->
        "10000,30000"). `description` is left out.

    Raises:
        ConfigError: the file cannot be read, is not a YAML mapping, or names an option
            the command does not have.

    Example:
        `workloads/s3-standard.yaml` holding `{store: s3-standard, rates: [10000, 30000]}`
        gives `{"store": "s3-standard", "rates": "10000,30000"}`.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(
            f"cannot read the workload file {path}: {exc.strerror or exc}",
            "give the path of a YAML file, e.g. workloads/sweep-100ms.yaml",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"the workload file {path} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"the workload file {path} must be a mapping of option names to values",
            "write one `option: value` per line, e.g. `rates: [10000, 30000]`",
        )
    values: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in data.items():
        name = str(key).strip().lstrip("-").replace("-", "_")
        if name == DESCRIPTION:
            continue
        if name not in options:
            unknown.append(str(key))
            continue
        values[name] = ",".join(str(v) for v in value) if isinstance(value, list) else value
    if unknown:
        known = ", ".join(sorted(n.replace("_", "-") for n in options))
        raise ConfigError(
            f"the workload file {path} names unknown option(s): {', '.join(unknown)}",
            f"use the options of `deltabus bench --help`: {known}",
        )
    return values


def apply_workload(
    ctx: typer.Context, param: typer.CallbackParam, value: Path | None
) -> Path | None:
    """An eager option's callback: the file's values become the command's defaults, so the
    command line still overrides each of them."""
    if value is None or ctx.resilient_parsing:
        return value
    options = {p.name: p for p in ctx.command.params if p.name and p.name != param.name}
    ctx.default_map = {**(ctx.default_map or {}), **load_workload(value, options)}
    return value
