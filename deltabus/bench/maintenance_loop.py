"""Soak scenario: lake maintenance (compact, checkpoint, vacuum) every N seconds.

Runs as its own process (`python -m deltabus.bench.maintenance_loop --interval 60`) on
the lake the DELTABUS_* environment names, printing one JSON line per pass, until
SIGTERM. Retention is far longer than any benchmark, so vacuum never removes a file a
lagging reader still needs.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="periodic lake maintenance for soak runs")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between passes")
    parser.add_argument("--retention-hours", type=float, default=24.0)
    args = parser.parse_args(argv)
    from deltabus.lake import INPUT_TABLES, UNIFIED_TABLE, Lake
    from deltabus.logs import setup_logging
    from deltabus.maintenance import maintain
    from deltabus.settings import load_settings

    setup_logging()
    lake = Lake(load_settings())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(args.interval):
        started = time.time()
        try:
            done = maintain(lake, (*INPUT_TABLES, UNIFIED_TABLE), args.retention_hours)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
