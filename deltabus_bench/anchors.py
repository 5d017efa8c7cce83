"""The published figures deltabus' benchmark compares itself with, by commit profile."""

from __future__ import annotations

# docs/design/architecture.md, "Anchors": Pathway's published Delta-on-MinIO benchmark
# (its own Delta connector, single-threaded, 5-minute runs, 30 s warm-up).
# (p50 s, p99 s, fell behind)
ANCHORS: dict[str, dict[int, tuple[float, float, bool]]] = {
    "1000ms": {
        10_000: (0.94, 1.94, False),
        70_000: (1.45, 2.05, False),
        150_000: (1.68, 3.09, False),
        250_000: (1.98, 4.58, True),
    },
    "100ms": {
        10_000: (0.26, 0.67, False),
        30_000: (0.28, 0.64, False),
        70_000: (1.24, 41.32, True),
    },
}


def profile_key(profile: str) -> str:
    """'100ms' -> '100ms', '1s' -> '1000ms' (the anchors' keys)."""
    from deltabus_bench.config import parse_profile

    return f"{int(round(parse_profile(profile) * 1000))}ms"
