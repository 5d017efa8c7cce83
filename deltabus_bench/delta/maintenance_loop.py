"""Soak scenario: lake maintenance (compact, checkpoint, vacuum) every N seconds.

Runs as its own process (`python -m deltabus_bench.delta.maintenance_loop --interval 60`) on
the lake the DELTABUS_* environment names, printing one JSON line per pass, until
SIGTERM. `--retention-s` drops the records committed longer ago from every table of the
pipeline (deltabus.delta.retention); otherwise only the unified table's
DELTABUS_UNIFIED_RETENTION_S applies. Vacuum's retention (`--retention-hours`, whole
hours, default 24) is far longer than any reader's lag, so vacuum never removes a file a
lagging reader still needs.

Without `--first-at`, a pass starts `--interval` s after the previous one ended (and
after the start). With `--first-at EPOCH_S`, passes are due at EPOCH_S + k x interval
(k = 0, 1, ...), whatever each takes (a slot that a long pass overran is skipped), so they
keep their place within the soak's windows. After each pass the process hands the memory
the pass freed back to the system (Arrow's pool, then the C heap), so its resident size
between passes is what it holds, not what its largest pass once needed.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import signal
import sys
import threading
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="periodic lake maintenance for soak runs")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between passes")
    parser.add_argument("--retention-hours", type=float, default=24.0)
    parser.add_argument(
        "--retention-s", type=int, default=None, help="records' retention of every table"
    )
    parser.add_argument(
        "--first-at", type=float, default=None, help="epoch seconds of the first pass"
    )
    args = parser.parse_args(argv)
    from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_TABLE
    from deltabus.core.logs import setup_logging
    from deltabus.core.settings import load_settings
    from deltabus.delta.lake import Lake
    from deltabus.delta.maintenance import maintain
    from deltabus.delta.retention import RetentionPolicy

    setup_logging()
    lake = Lake(load_settings())
    tables = (*INPUT_TABLES, UNIFIED_TABLE)
    if args.retention_s is not None:
        retention = dict.fromkeys(tables, RetentionPolicy(max_age_s=args.retention_s))
    else:
        unified_s = lake.settings.unified_retention_s
        retention = {UNIFIED_TABLE: RetentionPolicy(max_age_s=unified_s)}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(_until_next(args.first_at, args.interval)):
        started = time.time()
        try:
            done = maintain(lake, tables, args.retention_hours, retention=retention)
            event = {
                "event": "pass",
                "start_ms": started * 1000,
                "end_ms": time.time() * 1000,
                "tables": [d.as_dict() for d in done],
            }
        except Exception as exc:  # noqa: BLE001 - reported, the soak goes on
            event = {"event": "error", "start_ms": started * 1000, "error": str(exc)[:500]}
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
        release_memory()
    return 0


def release_memory() -> None:
    """Return freed memory to the system: Python's cycles, Arrow's pool and, with glibc,
    the free pages of its heap (`malloc_trim`), which it otherwise keeps for reuse."""
    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name is not None else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _until_next(first_at: float | None, interval: float) -> float:
    """Seconds to wait for the next pass."""
    if first_at is None:
        return interval
    now = time.time()
    if now <= first_at:
        return first_at - now
    return interval - (now - first_at) % interval


if __name__ == "__main__":
    sys.exit(main())
