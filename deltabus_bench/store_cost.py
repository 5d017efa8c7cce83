"""What the object store alone spends on the commits of P partitions, with nothing else running.

Every table commit needs four requests, whatever deltabus does around them: the writer's
PUT of the data file and PUT-if-absent of the log entry, and one reader's GET of each.
A partition that gets rows in a commit window makes three table commits (its two input
tables and its unified table). Which partitions get rows is the partitioner's (the real
one, deltabus.apps.timezones.layout): with `sticky`, a window below 65,536 messages goes to one
partition, so P partitions make the commits of one; with `hash`, every partition commits
every window. This replays exactly those requests, with data files of the size a given
rate fills, against a throwaway local MinIO, and reports the CPU the MinIO process used:
the floor under the cost of a partition, since no client change can remove a request a
commit needs. Layouts are alternated, so a slow minute hits each of them.

    python -m deltabus_bench.store_cost [--partitions 1,2] [--rate 150000]
        [--interval-ms 100] [--seconds 30] [--repeats 2] [--partitioner sticky]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import obstore
from obstore.store import ObjectStore

from deltabus.apps.timezones.layout import (
    MAX_PARTITIONS,
    PARTITIONERS,
    TimezoneLayout,
    partition_of,
)
from deltabus.delta.lake import Lake
from deltabus_bench.environment import process_cpu_s, throwaway_minio

# Bytes per message of the data files as deltabus writes them (Snappy, dictionaries only
# where they pay; docs/design/checkpoints.md): 1.23 MB per 125k input rows, 1.89 MB per
# 125k unified.
INPUT_BYTES_PER_ROW = 9.8
UNIFIED_BYTES_PER_ROW = 15.1
# A producer's log entry: commitInfo, an app transaction and one add with its stats.
LOG_ENTRY_BYTES = 1400
REQUESTS_PER_COMMIT = 4


@dataclass(frozen=True)
class StoreCost:
    """The store's CPU for one layout over one measured window."""

    partitions: int
    rate: float
    commits: int
    requests: int
    seconds: float
    cpu_s: float

    @property
    def cores(self) -> float:
        return self.cpu_s / self.seconds

    @property
    def cpu_s_per_million_msgs(self) -> float:
        return self.cpu_s / (self.rate * self.seconds) * 1e6

    @property
    def ms_per_request(self) -> float:
        return self.cpu_s / self.requests * 1e3


def _commit(store: ObjectStore, table: str, data: bytes, log_entry: bytes, v: int) -> None:
    """The four requests of one table commit: write the data and claim the version, read both."""
    data_key = f"{table}/part-{v:05d}.parquet"
    log_key = f"{table}/_delta_log/{v:020d}.json"
    obstore.put(store, data_key, data)
    obstore.put(store, log_key, log_entry, mode="create")
    obstore.get(store, log_key).bytes()
    obstore.get(store, data_key).bytes()


def measure(
    store: ObjectStore,
    store_pid: int,
    partitions: int,
    rate: float,
    interval_s: float,
    seconds: float,
    partitioner: str = "sticky",
) -> StoreCost:
    """Commit the tables of every partition the partitioner gives rows, once per interval
    (concurrently, as the producer's and the ETL's commit threads do) for `seconds`, and
    account the store's CPU."""
    run = uuid.uuid4().hex[:8]
    layout = TimezoneLayout(partitions, partitioner)
    window = max(1, round(rate * interval_s))  # messages per commit window, both streams
    noise = os.urandom(int(window * UNIFIED_BYTES_PER_ROW) + 1)  # sliced for every file
    log_entry = b"{" + b"x" * (LOG_ENTRY_BYTES - 2) + b"}"
    versions: dict[str, int] = {}
    intervals = max(1, round(seconds / interval_s))
    commits = 0
    with ThreadPoolExecutor(max_workers=3 * partitions) as pool:
        before, start = process_cpu_s(store_pid), time.monotonic()
        for v in range(intervals):
            delay = start + v * interval_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            index = np.arange(v * window, (v + 1) * window, dtype=np.int64)
            counts = np.bincount(partition_of(run, index, layout, window), minlength=partitions)
            work = []
            for p in np.flatnonzero(counts):
                n = int(counts[p])
                # Each stream gets about half the rows; the unified table all of them.
                inputs = layout.inputs_of(int(p))
                work += [(t, max(1, int(n / 2 * INPUT_BYTES_PER_ROW))) for t in inputs]
                work.append((layout.unified_of(int(p)), max(1, int(n * UNIFIED_BYTES_PER_ROW))))
            futures = []
            for table, size in work:
                version = versions.get(table, -1) + 1
                versions[table] = version
                futures.append(
                    pool.submit(_commit, store, f"{run}/{table}", noise[:size], log_entry, version)
                )
            for f in futures:
                f.result()
            commits += len(work)
        elapsed, after = time.monotonic() - start, process_cpu_s(store_pid)
    if before is None or after is None:
        raise RuntimeError(f"the object store's process {store_pid} is gone")
    cpu = after - before
    return StoreCost(partitions, rate, commits, commits * REQUESTS_PER_COMMIT, elapsed, cpu)


def _partition_counts(text: str) -> list[int]:
    try:
        counts = [int(p) for p in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or max(counts) > MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(
            f"expected partition counts like 1,2 (got {text!r}); each is 1..{MAX_PARTITIONS}"
        )
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Starts its own MinIO on a free loopback port (built once with `make minio-bin`).",
    )
    parser.add_argument(
        "--partitions", type=_partition_counts, default=[1, 2], help="layouts, e.g. 1,2"
    )
    parser.add_argument("--rate", type=float, default=150_000, help="messages/s in all")
    parser.add_argument("--interval-ms", type=int, default=100, help="commit interval")
    parser.add_argument("--seconds", type=float, default=30, help="measured window per run")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the layouts")
    parser.add_argument(
        "--partitioner",
        choices=PARTITIONERS,
        default="sticky",
        help="which partitions get a window's rows: sticky (one per window, the default "
        "for new lakes) or hash (every partition, every window)",
    )
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.interval_ms <= 0 or args.seconds <= 0 or args.repeats < 1:
        parser.error("--rate, --interval-ms and --seconds must be positive, --repeats at least 1")

    with throwaway_minio(bucket="deltabus-store-cost") as (settings, pids):
        store = Lake(settings).object_store
        time.sleep(2)  # let MinIO's start-up work settle before the first window
        base: dict[int, float] = {}
        for r in range(args.repeats):
            for p in args.partitions:
                c = measure(
                    store,
                    pids["minio"],
                    p,
                    args.rate,
                    args.interval_ms / 1e3,
                    args.seconds,
                    args.partitioner,
                )
                base.setdefault(r, c.cpu_s_per_million_msgs)
                over = c.cpu_s_per_million_msgs / base[r] - 1
                print(
                    f"round {r + 1}, P={p}: {c.requests / c.seconds:.0f} requests/s, "
                    f"MinIO {c.cores:.3f} cores, {c.cpu_s_per_million_msgs:.2f} CPU-s per M msgs "
                    f"({over:+.0%} over P={args.partitions[0]}), "
                    f"{c.ms_per_request:.2f} CPU-ms per request",
                    flush=True,
                )


if __name__ == "__main__":
    sys.exit(main())
