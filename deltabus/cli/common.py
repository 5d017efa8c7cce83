"""Options and checks shared by several commands."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from deltabus.core.errors import ConfigError


def parse_instant_us(text: str) -> int:
    """An ISO-8601 instant with a zone (Z or +hh:mm) as epoch microseconds."""

    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"--start-at {text!r} is not an ISO-8601 instant", "e.g. 2026-03-08T06:59:55Z"
        ) from None
    if instant.tzinfo is None:
        raise ConfigError(f"--start-at {text!r} has no time zone", "add Z or +hh:mm")
    return int(instant.timestamp() * 1_000_000)


def check_output(out: Path) -> None:
    """Fail before any work, with one clear message, when `--out` cannot be written."""
    import tempfile

    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory", "give a file path, e.g. results.csv")
    parent = next(p for p in [out.parent, *out.parent.parents, Path(".")] if p.exists())
    if not parent.is_dir():
        raise ConfigError(f"--out {out}: {parent} is not a directory", "choose another --out")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".deltabus-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--out {out}: cannot write in {parent.absolute()}: {exc.strerror or exc}",
            "choose a writable path for --out",
        ) from None


# Shared by `produce` and `etl`: both may be the first to record a lake's layout.
PartitionsOption = Annotated[
    int | None,
    typer.Option(
        help="Partitions per stream (1..64): each a Delta table of its own "
        "(timezone1-p0 ...). Default: what the lake records (1 for a new lake). A lake "
        "keeps the number it was first written with.",
    ),
]
