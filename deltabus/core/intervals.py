"""Commit and poll intervals: one default, one range check, one unit inside the engine.

Command-line options and Dagster config speak milliseconds (`--commit-interval-ms 100`,
`--profile 100ms`); the engine carries seconds as a float, the unit of `time.monotonic`.
Each edge converts once with these functions, and every config object checks the range
with `check_interval`.
"""

from __future__ import annotations

import re

from deltabus.core.errors import ConfigError

DEFAULT_COMMIT_INTERVAL_MS = 100.0
DEFAULT_POLL_INTERVAL_MS = 20.0
MIN_INTERVAL_S = 0.001
MAX_INTERVAL_S = 60.0


def check_interval(seconds: float, what: str = "commit interval") -> float:
    """`seconds` if it is within 1 ms .. 60 s, else a ConfigError naming `what`."""
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise ConfigError(
            f"{what} must be between 1 ms and 60 s, got {seconds * 1000:g} ms",
            "100 ms suits low latency, 1000 ms high rates",
        )
    return seconds


def from_ms(ms: float, what: str = "commit interval") -> float:
    """Milliseconds from an option -> checked seconds."""
    return check_interval(float(ms) / 1000, what)


def to_ms_arg(seconds: float) -> str:
    """Seconds -> the text of a `--...-ms` option (no float noise: 0.1 -> '100')."""
    return f"{round(seconds * 1000, 3):g}"


def parse_duration(text: str, what: str = "--profile") -> float:
    """'100ms' / '1000ms' / '1s' -> checked seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*", text.lower())
    if not m:
        raise ConfigError(f"{what} {text!r} is not an interval", "use 100ms or 1000ms")
    return check_interval(float(m.group(1)) / (1000 if m.group(2) == "ms" else 1), what)
