"""Commands of packages installed beside the engine."""

from __future__ import annotations

import importlib
import importlib.util

from deltabus.cli.root import app
from deltabus.core.errors import ConfigError

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


def add_plugin_commands() -> None:
    """Register each plugin's commands, or commands saying where the absent one comes from."""
    for module, commands in COMMAND_PLUGINS.items():
        if importlib.util.find_spec(module.partition(".")[0]) is not None:
            importlib.import_module(module).register(app)
        else:
            for name in commands:
                _absent_plugin_command(name, module)
