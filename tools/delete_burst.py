"""Measure what deleting objects at once costs a stream beside it (ADR 0053).

    .venv/bin/python -m tools.delete_burst [--objects 18000] [--rate 50000] [--per-s 1000]

Starts a loopback MinIO, writes `--objects` objects twice (16 KiB each, under a prefix
of their own), then runs `deltabus bench` at `--rate` msg/s for 160 s on the same MinIO.
60 s into the run it deletes the first set at once (bulk requests of 1,000 on three
threads, a maintenance pass's three tables); 110 s in, the second set paced at `--per-s`
objects a second (deltabus.delta.vacuum). Prints the stream's per-second p50 and p99,
averaged over the seconds of each kind (burst, paced, quiet), and their ratios to quiet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from deltabus.core.processes import child_env
from deltabus.delta.lake import Lake
from deltabus.delta.vacuum import delete_paced
from tools.scratch_minio import put_objects, scratch_lake

DURATION_S = 160
BURST_AT_S, PACED_AT_S = 60, 110


def _burst(lake: Lake, keys: list[str]) -> None:
    thirds = [keys[i::3] for i in range(3)]

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda part: delete_paced(lake, part, 0, "burst deletes"), thirds))


def _deletes(lake: Lake, burst: list[str], paced: list[str], t0: float, per_s: float) -> dict:
    marks: dict[str, float] = {}
    time.sleep(max(0.0, t0 + BURST_AT_S - time.time()))
    marks["burst_start"] = time.time()
    _burst(lake, burst)
    marks["burst_end"] = time.time()
    time.sleep(max(0.0, t0 + PACED_AT_S - time.time()))
    marks["paced_start"] = time.time()
    delete_paced(lake, paced, per_s, "paced deletes")
    marks["paced_end"] = time.time()
    return marks


def _summary(run: dict, marks: dict) -> dict:
    origin = run["schedule_start_ms"] / 1000
    spans = {
        kind: (marks[f"{kind}_start"] - origin - 1, marks[f"{kind}_end"] - origin + 1)
        for kind in ("burst", "paced")
    }
    kinds: dict[str, list[dict]] = {"burst": [], "paced": [], "quiet": []}
    for row in run["over_time"]:
        t = row["t_s"]
        if t < run["warmup_s"] + 5 or t > DURATION_S - 5:
            continue
        kind = next((k for k, (a, b) in spans.items() if a <= t <= b), "quiet")
        kinds[kind].append(row)
    out: dict = {}
    for kind, rows in kinds.items():
        out[kind] = {
            "seconds": len(rows),
            "p50": round(statistics.mean(r["p50"] for r in rows), 3),
            "p99": round(statistics.mean(r["p99"] for r in rows), 3),
            "p99_max": round(max(r["p99"] for r in rows), 3),
        }
    for kind in ("burst", "paced"):
        out[kind]["p99_vs_quiet"] = round(out[kind]["p99"] / out["quiet"]["p99"], 2)
    out["deletes_s"] = {k: round(marks[f"{k}_end"] - marks[f"{k}_start"], 2) for k in spans}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=18_000, help="objects per set")
    parser.add_argument("--rate", type=int, default=50_000, help="the stream's msg/s")
    parser.add_argument("--per-s", type=float, default=1000.0, help="paced deletes a second")
    args = parser.parse_args()
    with scratch_lake("delete-burst", "lake") as (lake, work):
        sets = {k: [f"junk/{k}/o-{i:06d}" for i in range(args.objects)] for k in ("b", "p")}
        put_objects(lake, sets["b"] + sets["p"], 16384)
        time.sleep(5)
        out = work / "bench"
        t0 = time.time()
        marks: dict = {}
        deleter = threading.Thread(
            target=lambda: marks.update(_deletes(lake, sets["b"], sets["p"], t0, args.per_s))
        )
        deleter.start()
        command = [sys.executable, "-m", "deltabus", "bench", "--rates", str(args.rate)]
        command += ["--profile", "100ms", "--duration", str(DURATION_S), "--warmup", "10"]
        command += ["--out", str(out)]
        subprocess.run(command, env=child_env(lake.settings), check=True, stdout=subprocess.DEVNULL)
        deleter.join()
        run = json.loads((out / "runs" / f"delta-{args.rate}.json").read_text())
        print(json.dumps(_summary(run, marks), indent=2))


if __name__ == "__main__":
    main()
