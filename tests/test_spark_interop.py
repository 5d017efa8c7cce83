"""Delta Spark writes the inputs, Delta Spark reads the output: interoperability end to end.

Delta Spark 3.2 (pyspark 3.5, local[1]) writes timezone1/timezone2 on the test MinIO over
s3a while a continuous ETL tails them: appends, DELETE with and without deletion
vectors, UPDATE, MERGE, OPTIMIZE, column mapping (name and id, renames, added columns),
a table partitioned by `date`, checkpoints (the ETL restarts from one). After every
step timezone_unified's net content equals the inputs' current content as Spark reads
it, transformed independently; at the end Spark reads timezone_unified and agrees with
deltalake.

Runs with `make spark` (which installs pyspark + delta-spark and the jars); elsewhere it
is skipped unless DELTABUS_SPARK_REQUIRED=1, which makes a missing Spark a failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.delta.lake import Lake
from tests.helpers import read_table
from tests.spark.session import spark_missing, start_spark
from tests.test_foreign_writers import (
    assert_content_checks_pass,
    expected_net,
    rows,
    start_etl,
    stop_etl,
    unified_net,
    wait_for_net,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REQUIRED = os.environ.get("DELTABUS_SPARK_REQUIRED") == "1"


@pytest.fixture(scope="module")
def spark(minio: MinioServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    why = spark_missing()
    if why is not None:
        if REQUIRED:
            pytest.fail(f"the Spark interop suite must run here, but {why}")
        pytest.skip(f"Delta Spark is not set up ({why}); `make spark` runs this suite")
    started = time.monotonic()
    session = start_spark(
        minio.endpoint, minio.access_key, minio.secret_key, tmp_path_factory.mktemp("spark")
    )
    print(f"Spark session started in {time.monotonic() - started:.1f} s")
    yield session
    session.stop()


def s3a(lake: Lake, table: str) -> str:
    return lake.uri(table).replace("s3://", "s3a://", 1)


class SparkInputs:
    """Spark SQL on one lake's input tables, with rows staged as local Parquet."""

    def __init__(self, spark, lake: Lake, tmp_path: Path) -> None:
        self.spark = spark
        self.lake = lake
        self.tmp = tmp_path
        self.staged = 0

    def sql(self, statement: str) -> None:
        for table in ("timezone1", "timezone2", "timezone_unified"):
            statement = statement.replace(f"{{{table}}}", f"delta.`{s3a(self.lake, table)}`")
        started = time.monotonic()
        self.spark.sql(statement)
        print(f"spark: {statement.splitlines()[0][:90]} ({time.monotonic() - started:.1f} s)")

    def view(self, data: pa.Table, name: str) -> None:
        """Make `data` a temporary view `name` (through a Parquet file: no Python workers)."""
        self.staged += 1
        path = self.tmp / f"staged-{self.staged}.parquet"
        pq.write_table(data, path)
        self.spark.read.parquet(str(path)).createOrReplaceTempView(name)

    def append(self, table: str, data: pa.Table, columns: str = "date, message") -> None:
        self.view(data, "incoming")
        self.sql(f"INSERT INTO {{{table}}} ({columns}) SELECT {columns} FROM incoming")

    def content(self, lake: Lake, table: str) -> pa.Table:
        """The table's current content as Spark reads it."""
        frame = self.spark.read.format("delta").load(s3a(lake, table))
        collected = [r.asDict() for r in frame.collect()]
        if not collected:
            return pa.table({c: pa.array([], pa.string()) for c in frame.columns})
        return pa.Table.from_pylist(collected)

    def wait(self, etl) -> dict[str, float]:
        return wait_for_net(self.lake, etl, read=self.content)


def assert_spark_reads_unified(inputs: SparkInputs, lake: Lake) -> None:
    """Spark's reading of timezone_unified equals deltalake's, row for row and net."""
    frame = inputs.spark.read.format("delta").load(s3a(lake, UNIFIED_TABLE))
    by_spark = pl.DataFrame(
        [r.asDict() for r in frame.collect()],
        schema={"timestamp": pl.Float64, "message": pl.String, "time": pl.Int64, "diff": pl.Int64},
        orient="row",
    )
    by_deltalake = read_table(lake, UNIFIED_TABLE)
    key = ["message", "timestamp", "time", "diff"]
    assert by_spark.sort(key).equals(by_deltalake.select(by_spark.columns).sort(key))
    frame.createOrReplaceTempView("unified")
    net = inputs.spark.sql(
        "SELECT message, timestamp, sum(diff) AS copies FROM unified "
        "GROUP BY message, timestamp HAVING sum(diff) <> 0"
    ).collect()
    spark_net = pl.DataFrame(
        [r.asDict() for r in net],
        schema={"message": pl.String, "timestamp": pl.Float64, "copies": pl.Int64},
        orient="row",
    )
    assert spark_net.sort("message").equals(unified_net(lake).sort("message"))


def numbered(prefix: str, n: int, offset: str = "-0500") -> pa.Table:
    return rows(prefix, n, offset=offset)


def test_spark_dml_with_and_without_deletion_vectors(
    spark, minio_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = minio_lake
    inputs = SparkInputs(spark, lake, tmp_path)
    inputs.sql(
        "CREATE TABLE {timezone1} (date STRING, message STRING) USING delta TBLPROPERTIES ("
        "delta.enableChangeDataFeed = true, delta.enableDeletionVectors = true, "
        "delta.checkpointInterval = 3)"
    )
    inputs.sql(  # no change data feed: deletion vectors are read to find deleted rows
        "CREATE TABLE {timezone2} (date STRING, message STRING) USING delta TBLPROPERTIES ("
        "delta.enableDeletionVectors = true, delta.checkpointInterval = 3)"
    )
    inputs.append("timezone1", numbered("s1", 1200))
    inputs.append("timezone1", numbered("s1b", 300))
    inputs.append("timezone2", numbered("s2", 12_000, offset="+0100"))
    etl = start_etl(lake, tmp_path)
    assert len(inputs.wait(etl)) == 13_500

    # DELETE with deletion vectors (no change data files: the vectors' difference).
    inputs.sql("DELETE FROM {timezone1} WHERE message LIKE '%3'")
    inputs.wait(etl)
    # UPDATE with deletion vectors (change data files).
    inputs.sql(
        "UPDATE {timezone1} SET date = '2026-07-14 12:00:00.250000 +0200' WHERE message LIKE '%5'"
    )
    inputs.wait(etl)
    # MERGE: update, delete, insert.
    merge = pa.table(
        {
            "message": [f"s1-{i}" for i in range(100, 160)] + [f"sm-{i}" for i in range(40)],
            "date": ["2026-01-02 03:04:05.678901 -0500"] * 100,
            "op": ["u"] * 30 + ["d"] * 30 + ["i"] * 40,
        }
    )
    inputs.view(merge, "changes")
    inputs.sql(
        "MERGE INTO {timezone1} t USING changes s ON t.message = s.message "
        "WHEN MATCHED AND s.op = 'u' THEN UPDATE SET date = s.date "
        "WHEN MATCHED AND s.op = 'd' THEN DELETE "
        "WHEN NOT MATCHED THEN INSERT (date, message) VALUES (s.date, s.message)"
    )
    inputs.wait(etl)
    # Deletion vectors on a table without change data feed: a scattered half (bitmap
    # containers), a contiguous range (run containers), a handful (array containers).
    inputs.sql("DELETE FROM {timezone2} WHERE message RLIKE '[02468]$'")
    inputs.sql(
        "DELETE FROM {timezone2} WHERE CAST(split(message, '-')[1] AS INT) BETWEEN 2001 AND 8999"
    )
    inputs.sql("DELETE FROM {timezone2} WHERE message IN ('s2-9001', 's2-9003', 's2-11111')")
    inputs.wait(etl)
    # Column mapping turned on, the message column renamed away and back: each rename
    # reads every live row again (deletion vectors from a checkpoint) under both schemas.
    inputs.sql(
        "ALTER TABLE {timezone2} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
        "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
    )
    inputs.sql("ALTER TABLE {timezone2} RENAME COLUMN message TO msg")
    assert not any(m.startswith("s2-") for m in inputs.wait(etl))
    inputs.sql("ALTER TABLE {timezone2} RENAME COLUMN msg TO message")
    assert sum(m.startswith("s2-") for m in inputs.wait(etl)) > 2000
    # OPTIMIZE rewrites files (and purges deletion vectors): no row changes.
    inputs.sql("OPTIMIZE {timezone1}")
    inputs.sql("REORG TABLE {timezone2} APPLY (PURGE)")
    inputs.append("timezone1", numbered("s1c", 50))
    inputs.wait(etl)
    # DELETE without deletion vectors: a copy-on-write rewrite with change data files.
    inputs.sql("ALTER TABLE {timezone1} SET TBLPROPERTIES (delta.enableDeletionVectors = false)")
    inputs.sql("DELETE FROM {timezone1} WHERE message LIKE '%9'")
    inputs.wait(etl)

    # Restart: the ETL resumes from Spark's checkpoints (every 3 versions).
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    inputs.sql("UPDATE {timezone2} SET message = concat(message, '-u') WHERE message LIKE '%1'")
    inputs.append("timezone2", numbered("s2b", 100, offset="+0100"))
    etl = start_etl(lake, tmp_path)
    expected = inputs.wait(etl)
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    assert expected == expected_net(lake)  # deltalake reads the inputs the same way
    assert_spark_reads_unified(inputs, lake)
    assert_content_checks_pass(lake, monkeypatch)  # DuckDB reads the inputs via delta-rs


def test_spark_column_mapping_and_partitions(spark, minio_lake: Lake, tmp_path: Path) -> None:
    lake = minio_lake
    inputs = SparkInputs(spark, lake, tmp_path)
    inputs.sql(
        "CREATE TABLE {timezone1} (date STRING, message STRING) USING delta PARTITIONED BY (date) "
        "TBLPROPERTIES (delta.columnMapping.mode = 'name', delta.enableChangeDataFeed = true, "
        "delta.checkpointInterval = 3)"
    )
    inputs.sql(  # the wrong column name: every row is rejected until it is renamed
        "CREATE TABLE {timezone2} (date STRING, msg STRING) USING delta TBLPROPERTIES ("
        "delta.columnMapping.mode = 'id', delta.enableChangeDataFeed = true)"
    )
    by_date = rows("c1", 300, dates=15)
    for start in (0, 100, 200):  # three commits: a checkpoint at version 3
        inputs.append("timezone1", by_date.slice(start, 100))
    inputs.append(
        "timezone2",
        numbered("c2", 200, offset="+0100").rename_columns(["date", "msg"]),
        "date, msg",
    )
    etl = start_etl(lake, tmp_path)
    assert len(inputs.wait(etl)) == 300

    # A rename makes the rejected rows valid: they are read again and inserted.
    inputs.sql("ALTER TABLE {timezone2} RENAME COLUMN msg TO message")
    assert len(inputs.wait(etl)) == 500
    # message renamed away and a new `message` column added: earlier rows are retracted
    # (their message is now null), later rows take the new column's values.
    inputs.sql("ALTER TABLE {timezone1} RENAME COLUMN message TO old_message")
    inputs.sql("ALTER TABLE {timezone1} ADD COLUMNS (message STRING)")
    assert len(inputs.wait(etl)) == 200
    inputs.append("timezone1", rows("c1b", 120, dates=6))
    expected = inputs.wait(etl)
    assert len(expected) == 320 and all(m.startswith(("c1b-", "c2-")) for m in expected)
    # Partition-level and row-level changes on the partitioned, mapped table.
    one_date = by_date["date"][2].as_py()
    inputs.sql(f"DELETE FROM {{timezone1}} WHERE date = '{one_date}'")
    inputs.sql("UPDATE {timezone1} SET message = concat(message, '-u') WHERE message LIKE '%7'")
    inputs.sql("DELETE FROM {timezone2} WHERE message LIKE '%4'")
    inputs.wait(etl)

    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    inputs.append("timezone1", rows("c1c", 30, dates=3))
    etl = start_etl(lake, tmp_path)  # resumes from a checkpoint with column mapping
    expected = inputs.wait(etl)
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    assert expected == expected_net(lake)
    assert_spark_reads_unified(inputs, lake)
