"""Delta Spark cleans up an input table's log while a continuous ETL tails it.

Delta Spark 3.2 (`make spark`) creates timezone1/timezone2 with a one-hour
`delta.logRetentionDuration` and a checkpoint every 3 commits, and appends to them while
one ETL process tails them. Spark then writes a checkpoint of each input and deletes its
expired log files, so that the commits the ETL started from (00000000000000000000.json
on) are gone from MinIO; more commits follow. The same ETL process keeps running and
timezone_unified's net content equals the inputs' content, every row exactly once.

Spark expires log files only before midnight (UTC) of `now - retention`, so files written
during the test never expire on the real clock: the cleanup runs on a DeltaLog bound to
a clock three days ahead.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deltabus.delta.lake import Lake
from tests.test_foreign_writers import rows, start_etl, stop_etl
from tests.test_spark_interop import SparkInputs, s3a, spark  # noqa: F401 - fixture

pytestmark = [pytest.mark.spark, pytest.mark.integration]

DAY_MS = 24 * 3600 * 1000


def log_files(lake: Lake, table: str) -> list[str]:
    """The names of the table's `_delta_log/` objects on MinIO."""
    prefix = f"{lake.settings.prefix}/{table}/_delta_log/"
    pages = lake.s3_client().get_paginator("list_objects_v2")
    listing = pages.paginate(Bucket=lake.settings.bucket, Prefix=prefix)
    return sorted(o["Key"][len(prefix) :] for page in listing for o in page.get("Contents", []))


def checkpoint_and_clean_up(session, lake: Lake, table: str) -> None:
    """Spark's checkpoint of `table`'s latest version (which must not have one yet) and
    cleanup of its expired log files, on a clock three days ahead; errors are raised."""
    jvm = session.sparkContext._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog
    delta_log.clearCache()  # the cached DeltaLog has the system clock
    clock = jvm.org.apache.spark.util.ManualClock(int(time.time() * 1000) + 3 * DAY_MS)
    path = jvm.org.apache.hadoop.fs.Path(s3a(lake, table))
    log = delta_log.forTable(session._jsparkSession, path, clock)
    log.checkpointAndCleanUpDeltaLog(log.unsafeVolatileSnapshot())
    delta_log.clearCache()


def test_spark_log_cleanup_under_a_running_etl(
    spark,  # noqa: F811
    minio_lake: Lake,
    tmp_path: Path,
) -> None:
    lake = minio_lake
    inputs = SparkInputs(spark, lake, tmp_path)
    for table in ("timezone1", "timezone2"):
        inputs.sql(
            f"CREATE TABLE {{{table}}} (date STRING, message STRING) USING delta TBLPROPERTIES "
            "(delta.logRetentionDuration = 'interval 1 hour', delta.checkpointInterval = 3)"
        )
    inputs.append("timezone1", rows("a1", 200))
    inputs.append("timezone2", rows("a2", 200, offset="+0100"))
    etl = start_etl(lake, tmp_path)
    assert len(inputs.wait(etl)) == 400

    for i in range(4):  # versions 2-5 of timezone1, 2-4 of timezone2 (checkpoint at 3)
        inputs.append("timezone1", rows(f"b1.{i}", 50))
        if i < 3:
            inputs.append("timezone2", rows(f"b2.{i}", 50, offset="+0100"))
    assert len(inputs.wait(etl)) == 750

    for table, latest in (("timezone1", 5), ("timezone2", 4)):
        assert "00000000000000000000.json" in log_files(lake, table)
        checkpoint_and_clean_up(spark, lake, table)
        left = log_files(lake, table)
        gone = [f"{v:020d}.json" for v in range(latest)]
        assert not set(gone) & set(left), f"{table}: old commits still there: {left}"
        assert f"{latest:020d}.checkpoint.parquet" in left, left
        assert f"{latest:020d}.json" in left, left

    for i in range(4):  # commits after the cleanup, on both inputs
        inputs.append("timezone1", rows(f"c1.{i}", 30))
        inputs.append("timezone2", rows(f"c2.{i}", 30, offset="+0100"))
    assert len(inputs.wait(etl)) == 990
    assert etl.poll() is None, f"ETL process {etl.pid} exited after catching up"
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
