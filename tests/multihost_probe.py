"""Per-call latency through a surviving MinIO node after a peer host's link is cut.

    python -m tests.multihost_probe [SYSCTL=VALUE ...]   # as root

Builds the multi-host lab (tests/netns.py: 5 namespaces, a 4-node MinIO at
`MINIO_DRIVE_MAX_TIMEOUT=2s` as `make multihost` runs it), applies each SYSCTL in every
host namespace (for example `net.ipv4.neigh.eth0.base_reachable_time_ms=2000`), then
makes four calls in a loop through node 4 (a LIST, a GET of an object written before the
cut, a GET of a missing key, a conditional PUT), cuts host 1's link and prints, per call,
until when it was slow (over 0.5 s) or failed in the 75 s after the cut.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import obstore

from deltabus.adapters.dev.minio_process import MinioCluster
from tests import test_multihost as mh
from tests.netns import Lab

WATCH_S = 75.0


def main(sysctls: list[str]) -> int:
    os.environ["MINIO_DRIVE_MAX_TIMEOUT"] = mh.MINIO_DRIVE_TIMEOUT
    with Lab(5) as lab, tempfile.TemporaryDirectory() as tmp:
        for host in range(1, 6):
            for setting in sysctls:
                subprocess.run([*lab.exec_prefix(host), "sysctl", "-qw", setting], check=True)
        cluster = MinioCluster(
            Path(tmp),
            access_key="probe-" + secrets.token_hex(4),
            secret_key=secrets.token_urlsafe(18),
            ports=[9000] * 4,
            hosts=[lab.address(h) for h in range(1, 5)],
            launch=lambda node: lab.exec_prefix(node + 1),
            binary=mh.minio_binary(),
        )
        try:
            store = mh.start_cluster(cluster, "probe").object_store
            obstore.put(store, "probe/old", b"o" * 100)

            def missing(i: int) -> None:
                try:
                    obstore.get(store, f"probe/missing-{i}").bytes()
                except FileNotFoundError:
                    pass

            calls: dict[str, Callable[[int], Any]] = {
                "LIST": lambda i: list(obstore.list(store, prefix="probe/old")),
                "GET (written before the cut)": lambda i: obstore.get(store, "probe/old").bytes(),
                "GET (missing)": missing,
                "PUT (create)": lambda i: obstore.put(store, f"probe/op-{i}", b"p", mode="create"),
            }
            seen: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in calls}
            stop = threading.Event()
            cut_at = time.time() + 5

            def loop(name: str, call: Callable[[int], Any]) -> None:
                i = 0
                while not stop.is_set():
                    start, ok = time.time(), True
                    try:
                        call(i)
                    except Exception:  # noqa: BLE001 - a failure is what is measured
                        ok = False
                    seen[name].append((start - cut_at, time.time() - start, ok))
                    i += 1
                    time.sleep(0.2)

            threads = [
                threading.Thread(target=loop, args=item, daemon=True) for item in calls.items()
            ]
            for thread in threads:
                thread.start()
            time.sleep(max(0.0, cut_at - time.time()))
            lab.cut(1)
            time.sleep(WATCH_S)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            print(f"after host 1's link was cut (sysctls: {' '.join(sysctls) or 'defaults'}):")
            for name, ops in seen.items():
                bad = [(s, d, ok) for s, d, ok in ops if s >= 0 and (d > 0.5 or not ok)]
                until = max((s + d for s, d, _ in bad), default=0.0)
                worst = max((d for _, d, _ in bad), default=0.0)
                failed = sum(1 for *_, ok in bad if not ok)
                print(
                    f"  {name}: slow or failed until {until:.1f} s ({len(bad)} calls, "
                    f"slowest {worst:.1f} s, {failed} failed)"
                )
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
