"""A consumer-group member for tests/test_multihost.py, as a process of its own (it runs
in a host's network namespace). Public API only; the lake comes from the environment.

    python -m tests.multihost_worker consume STREAM GROUP TTL_S

Writes one JSON line per batch to stdout: `t` (wall clock when it was handed over),
`member`, `partition`, `version` and the batch's `id` column; logs to stderr with the
wall-clock time first (`<epoch s> <logger> <level> <message>`), so the test can line up
"took", "released" and "lost its lease" with the batches. Auto-commit: a batch is
committed at the next poll (at least once).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from types import FrameType

import deltabus


def consume(stream: str, group: str, ttl_s: float) -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(created).3f %(name)s %(levelname)s %(message)s",
    )
    stop: list[int] = []

    def on_term(signum: int, _frame: FrameType | None) -> None:
        stop.append(signum)

    signal.signal(signal.SIGTERM, on_term)
    bus = deltabus.connect()
    with bus.consumer(stream, group=group, ttl_s=ttl_s) as consumer:
        print(json.dumps({"t": time.time(), "member": consumer.member}), flush=True)
        while not stop:
            batch = consumer.poll(0.5)
            if batch is None:
                continue
            line = {
                "t": time.time(),
                "member": consumer.member,
                "partition": batch.partition,
                "version": batch.version,
                "ids": batch.rows.column("id").to_pylist(),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    if sys.argv[1] != "consume" or len(sys.argv) != 5:
        sys.exit(__doc__)
    consume(sys.argv[2], sys.argv[3], float(sys.argv[4]))
