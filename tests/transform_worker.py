"""orders -> orders_eur by the bus' transform, as a separate process for tests that
SIGKILL it or fence it; the lake comes from the environment.

    python -m tests.transform_worker group TTL_S   # a TransformGroup replica of "eur"
    python -m tests.transform_worker one P         # partition P alone, until fenced

Prints one JSON line when running (`member` or `partition`, and `pid`), and one with
`error` and `problem` before exiting with status 2 when a `DeltabusError` stops it.
SIGTERM stops it (a replica leaves its group).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

import deltabus
from tests.bus_worker import to_eur


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    bus = deltabus.connect()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if sys.argv[1] == "group":
            ttl_s = float(sys.argv[2])
            replica = bus.transform_group("eur", "orders", "orders_eur", to_eur, ttl_s=ttl_s)
            print(json.dumps({"member": replica.member, "pid": os.getpid()}), flush=True)
            replica.run(stop)
        else:
            partition = int(sys.argv[2])
            transform = bus.transform("eur", "orders", "orders_eur", partition, to_eur)
            print(json.dumps({"partition": partition, "pid": os.getpid()}), flush=True)
            transform.run(stop)
    except deltabus.DeltabusError as exc:
        print(json.dumps({"error": type(exc).__name__, "problem": exc.problem}), flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
