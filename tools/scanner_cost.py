"""Measure what MinIO's background scanner costs a loopback MinIO as objects pile up.

    .venv/bin/python -m tools.scanner_cost [--objects 136000] [--seconds 120]
        [--speeds default,slowest]

Per scanner speed (`MINIO_SCANNER_SPEED`), a fresh loopback MinIO: its CPU over 30 s with
an empty bucket, then `--objects` objects of 4 KiB are written (three table-like
prefixes), then its CPU over `--seconds` with no request at all. Prints, per speed, the
CPU share of one core before and after, and per 30-s slice after. The 2-hour soak's
MinIO went from 12.9 to 18.2 % of a core at the same request rate while the objects
under its prefix grew from 38,628 to 129,780.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import psutil

from deltabus.delta.lake import Lake
from deltabus_bench.environment import cpu_model, process_cpu_s
from tools.scratch_minio import put_objects, scratch_lake

SLICE_S = 30.0


def _minio() -> psutil.Process:
    for child in psutil.Process().children(recursive=True):
        if child.name() == "minio":
            return child
    raise SystemExit("no MinIO child process found")


def _cpu_slices(pid: int, seconds: float) -> list[float]:
    """Percent of one core per `SLICE_S` slice over `seconds`."""
    slices = []
    for _ in range(max(1, round(seconds / SLICE_S))):
        before, start = process_cpu_s(pid) or 0.0, time.monotonic()
        time.sleep(SLICE_S)
        used = (process_cpu_s(pid) or 0.0) - before
        slices.append(round(100 * used / (time.monotonic() - start), 1))
    return slices


def _load(lake: Lake, objects: int) -> float:
    """Write `objects` objects of 4 KiB; the seconds it took."""
    start = time.monotonic()
    put_objects(lake, [f"t{i % 3}/part-{i:07d}.parquet" for i in range(objects)], 4096)
    return time.monotonic() - start


def measure(speed: str, objects: int, seconds: float) -> dict:
    os.environ["MINIO_SCANNER_SPEED"] = speed
    with scratch_lake("scanner-cost", "scan") as (lake, _):
        minio = _minio().pid
        empty = _cpu_slices(minio, SLICE_S)
        load_s = _load(lake, objects)
        after = _cpu_slices(minio, seconds)
    return {
        "speed": speed,
        "objects": objects,
        "load_s": round(load_s, 1),
        "empty_pct": empty[0],
        "loaded_pct": round(sum(after) / len(after), 1),
        "loaded_slices_pct": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=136_000)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--speeds", default="default,slowest")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; MinIO's CPU in % of one core, no requests while measured")
    for speed in args.speeds.split(","):
        print(json.dumps(measure(speed, args.objects, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
