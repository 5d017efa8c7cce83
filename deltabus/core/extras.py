"""The optional parts of deltabus (`pip install 'deltabus[EXTRA]'`) and the modules each
provides, so that a command whose extra is missing says which one to install.

A missing module is told by `ModuleNotFoundError.name` (its top-level package), never by
the text of the error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec

from deltabus.core.errors import MissingExtraError

_PATHWAY = frozenset({"pathway", "polars", "duckdb"})
_SERVE = frozenset({"psycopg2", "opensearchpy", "polars"})

# The top-level modules each extra installs (pyproject.toml, [project.optional-dependencies];
# tests/test_install.py checks the two agree). An extra that includes another
# (`deltabus[pathway,serve]`) provides its modules too.
EXTRA_MODULES: dict[str, frozenset[str]] = {
    "pathway": _PATHWAY,
    "serve": _SERVE,
    "dagster": _PATHWAY
    | _SERVE
    | {
        "dagster",
        "dagster_webserver",
        "dagster_graphql",
        "dagster_pipes",
        "dagster_aws",
        "dagster_duckdb",
        "dagster_postgres",
        "dagster_k8s",
        "great_expectations",
        "yaml",
    },
    "bench": _PATHWAY | _SERVE | {"matplotlib", "confluent_kafka", "yaml", "rich"},
}


def install_command(extra: str) -> str:
    return f"pip install 'deltabus[{extra}]'"


def missing_extra_error(command: str, extra: str) -> MissingExtraError:
    """The one-line error: `command` needs `extra`, and how to install it."""
    return MissingExtraError(f"{command} needs the {extra} extra: {install_command(extra)}")


def missing_extra(exc: BaseException, extra: str, command: str) -> MissingExtraError | None:
    """The error naming `extra` when `exc` says a module that extra provides is not
    installed; None for any other error (a module of no extra missing is a bug)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    if exc.name.partition(".")[0] not in EXTRA_MODULES[extra]:
        return None
    return missing_extra_error(command, extra)


@contextmanager
def needs_extra(extra: str, command: str) -> Iterator[None]:
    """Run a block (or, as a decorator, a function) that imports modules of `extra`: a
    module of it that is not installed raises MissingExtraError naming `command` and the
    extra. Other errors pass unchanged."""
    if extra not in EXTRA_MODULES:
        raise ValueError(f"unknown extra {extra!r}")
    try:
        yield
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, extra, command)
        if error is None:
            raise
        raise error from None


def require_extra(extra: str, command: str, modules: Iterable[str] | None = None) -> None:
    """Raise MissingExtraError before any work when one of `modules` (default: every
    module of `extra`) is not installed. Looks the modules up without importing them."""
    for module in EXTRA_MODULES[extra] if modules is None else modules:
        if find_spec(module) is None:
            raise missing_extra_error(command, extra)
