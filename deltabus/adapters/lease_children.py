"""What the lease supervisors (`deltabus etl --lease`, `deltabus link`) share about the
child processes they run for the partitions they hold: stop and restart timings, how a
child is killed, and whether a newer writer fenced it."""

from __future__ import annotations

import socket
import subprocess

from deltabus.bus.fence import current_epoch, epoch_owner
from deltabus.delta.lake import Lake

STOP_TIMEOUT_S = 20.0  # a child told to stop is killed after this
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # before restarting a failed child, by failures
STEADY_S = 60.0  # a child that ran this long before failing starts its backoff afresh
FATAL_STATUS = 2  # `deltabus`'s status for an error the user must fix


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` unless it already ended."""
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def claimed_since(lake: Lake, tables: list[str], pid: int, started_wall: float) -> bool:
    """True when a writer other than process `pid` of this host, started after
    `started_wall` (epoch s), holds the newest fencing claim of one of `tables`."""
    host = socket.gethostname()
    for table in tables:
        try:
            dt = lake.open(table)
            owner = epoch_owner(dt, current_epoch(dt)) or {}
        except Exception:  # noqa: BLE001 - unreadable now: not known to be fenced
            continue
        ours = owner.get("pid") == pid and owner.get("host") == host
        if not ours and float(owner.get("started", 0)) > started_wall:
            return True
    return False
