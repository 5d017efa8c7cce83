"""`python -m deltabus.bench.store_cost`: the object store's own cost of P partitions' commits."""

from __future__ import annotations

import subprocess
import sys

import obstore

from deltabus.bench.store_cost import REQUESTS_PER_COMMIT, measure
from deltabus.lake import Lake
from deltabus.local_minio import MinioServer


def test_each_table_commit_writes_and_reads_back_its_data_and_log_entry(
    minio: MinioServer, minio_lake: Lake
) -> None:
    store = minio_lake.object_store
    assert minio.process is not None
    cost = measure(
        store, minio.process.pid, partitions=2, rate=20_000, interval_s=0.05, seconds=0.5
    )
    # Two input tables and one unified table per partition, one commit each per interval.
    assert cost.commits == 10 * 3 * 2
    assert cost.requests == cost.commits * REQUESTS_PER_COMMIT
    keys = [m["path"] for chunk in obstore.list(store, chunk_size=1000) for m in chunk]
    logs = [k for k in keys if "/_delta_log/" in k]
    data = [k for k in keys if k.endswith(".parquet")]
    assert len(logs) == len(data) == cost.commits
    tables = {k.split("/")[1] for k in logs}
    assert tables == {f"timezone{s}-p{p}" for s in ("1", "2", "_unified") for p in (0, 1)}
    # A unified file carries both streams' rows: twice an input file, at 1.5x the bytes a row.
    sizes = {k.split("/")[1]: len(obstore.get(store, k).bytes()) for k in data}
    assert sizes["timezone_unified-p0"] > 2 * sizes["timezone1-p0"]
    assert cost.cpu_s > 0 and cost.ms_per_request > 0


def test_invalid_partition_counts_are_refused_with_a_clear_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "deltabus.bench.store_cost", "--partitions", "0,2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "expected partition counts like 1,2 (got '0,2')" in out.stderr
