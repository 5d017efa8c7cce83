"""The package version, written into every commit deltabus makes."""

from __future__ import annotations

__version__ = "0.1.0"


def installed_version() -> str:
    """The version of the installed `deltabus` distribution, from its metadata (what pip
    reports); `__version__` when deltabus runs from a source tree that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deltabus")
    except PackageNotFoundError:
        return __version__
