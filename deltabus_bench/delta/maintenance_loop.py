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
keep their place within the soak's windows.

Each pass is a process of its own (`--once`), as a deployment's `deltabus streams
maintain` or Dagster run is; its JSON line carries the pass's peak resident memory
(`peak_rss_mb`, from the kernel's accounting of the ended child). A process kept across
passes grew by about 40 MB a pass against MinIO (docs/adr/0054).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
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
    parser.add_argument("--once", action="store_true", help="one pass in this process, then exit")
    args = parser.parse_args(argv)
    if args.once:
        sys.stdout.write(json.dumps(one_pass(args.retention_hours, args.retention_s)) + "\n")
        return 0
    pass_args = ["--once", "--retention-hours", str(args.retention_hours)]
    if args.retention_s is not None:
        pass_args += ["--retention-s", str(args.retention_s)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(_until_next(args.first_at, args.interval)):
        event = run_pass(pass_args)
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    return 0


def one_pass(retention_hours: float, retention_s: int | None) -> dict:
    """Maintain the time-zone pipeline's tables on the lake DELTABUS_* names; the pass's
    JSON event (`pass`, or `error` with its message: the soak goes on)."""
    from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_TABLE
    from deltabus.core.logs import setup_logging
    from deltabus.core.settings import load_settings
    from deltabus.delta.lake import Lake
    from deltabus.delta.maintenance import maintain
    from deltabus.delta.retention import RetentionPolicy

    setup_logging()
    started = time.time()
    try:
        lake = Lake(load_settings())
        tables = (*INPUT_TABLES, UNIFIED_TABLE)
        if retention_s is not None:
            retention = dict.fromkeys(tables, RetentionPolicy(max_age_s=retention_s))
        else:
            unified_s = lake.settings.unified_retention_s
            retention = {UNIFIED_TABLE: RetentionPolicy(max_age_s=unified_s)}
        done = maintain(lake, tables, retention_hours, retention=retention)
    except Exception as exc:  # noqa: BLE001 - reported, the soak goes on
        return {"event": "error", "start_ms": started * 1000, "error": str(exc)[:500]}
    return {
        "event": "pass",
        "start_ms": started * 1000,
        "end_ms": time.time() * 1000,
        "tables": [d.as_dict() for d in done],
    }


def run_pass(pass_args: list[str]) -> dict:
    """One pass as a child process (`--once`): its event, with `peak_rss_mb`; an `error`
    event if it printed no JSON line (it died). On Linux the child gets SIGTERM if this
    process dies first, so a loop killed mid-pass leaves no pass behind."""
    started = time.time()
    command = [sys.executable, "-m", "deltabus_bench.delta.maintenance_loop", *pass_args]
    preexec = _terminate_with_parent if sys.platform == "linux" else None
    with subprocess.Popen(command, stdout=subprocess.PIPE, preexec_fn=preexec) as child:
        assert child.stdout is not None
        out = child.stdout.read().decode(errors="replace")
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, for its usage
    lines = out.strip().splitlines()
    try:
        event = json.loads(lines[-1])
    except (IndexError, ValueError):
        reason = f"the pass exited {child.returncode} without a result: {out[-300:]!r}"
        event = {"event": "error", "start_ms": started * 1000, "error": reason}
    event["peak_rss_mb"] = round(usage.ru_maxrss / 1024, 1)  # Linux counts KiB
    return event


def _terminate_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the parent dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


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
