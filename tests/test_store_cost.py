"""`python -m deltabus_bench.store_cost`: the store's own cost of P partitions."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import obstore
import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.delta.lake import Lake
from deltabus_bench.store_cost import REQUESTS_PER_COMMIT, measure


@pytest.mark.parametrize("partitioner", ["hash", "sticky"])
def test_each_table_commit_writes_and_reads_back_its_data_and_log_entry(
    minio: MinioServer, minio_lake: Lake, partitioner: str
) -> None:
    store = minio_lake.object_store
    assert minio.process is not None
    cost = measure(
        store,
        minio.process.pid,
        partitions=2,
        rate=20_000,
        interval_s=0.05,
        seconds=0.5,
        partitioner=partitioner,
    )
    # Two input tables and one unified table per partition that got rows: with hash
    # placement both partitions every window; sticky gives each window (1,000 messages)
    # to one partition, in turn.
    assert cost.commits == 10 * 3 * (2 if partitioner == "hash" else 1)
    assert cost.requests == cost.commits * REQUESTS_PER_COMMIT
    keys = [m["path"] for chunk in obstore.list(store, chunk_size=1000) for m in chunk]
    logs = [k for k in keys if "/_delta_log/" in k]
    data = [k for k in keys if k.endswith(".parquet")]
    assert len(logs) == len(data) == cost.commits
    tables = {k.split("/")[1] for k in logs}
    assert tables == {f"timezone{s}-p{p}" for s in ("1", "2", "_unified") for p in (0, 1)}
    per_table = Counter(k.split("/")[1] for k in logs)
    assert set(per_table.values()) == {10 if partitioner == "hash" else 5}, per_table
    # A unified file carries both streams' rows: twice an input file, at 1.5x the bytes a row.
    sizes = {k.split("/")[1]: len(obstore.get(store, k).bytes()) for k in data}
    assert sizes["timezone_unified-p0"] > 2 * sizes["timezone1-p0"]
    assert cost.cpu_s > 0 and cost.ms_per_request > 0


def test_invalid_partition_counts_are_refused_with_a_clear_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "deltabus_bench.store_cost", "--partitions", "0,2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "expected partition counts like 1,2 (got '0,2')" in out.stderr
