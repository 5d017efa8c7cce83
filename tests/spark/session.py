"""A local Delta Spark session (local[1]) that reads and writes the test MinIO over s3a.

pyspark and delta-spark come from the `spark` dependency group (`make spark`); the Delta
and s3a jars from Maven Central, cached by `platform/spark.sh fetch`. `spark_missing()`
says what is not there, so the interop tests can skip outside `make spark`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPARK_SH = ROOT / "platform" / "spark.sh"


def spark_jars() -> list[str] | None:
    """The cached Delta + s3a jars, or None when `platform/spark.sh fetch` has not run."""
    done = subprocess.run(["bash", str(SPARK_SH), "jars"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return done.stdout.strip().split(",")


def spark_missing() -> str | None:
    """Why a Spark session cannot start here, or None when it can."""
    for module in ("pyspark", "delta"):
        if importlib.util.find_spec(module) is None:
            return f"python package {module} is not installed (uv sync --group spark)"
    if spark_jars() is None:
        return "the Delta and s3a jars are not cached (bash platform/spark.sh fetch)"
    if shutil.which("java") is None:
        return "no java on PATH (Java 17)"
    return None


def start_spark(endpoint: str, access_key: str, secret_key: str, warehouse: Path):
    """A SparkSession with Delta's extensions and s3a pointed at the MinIO `endpoint`."""
    from pyspark.sql import SparkSession

    jars = spark_jars()
    assert jars, "run `bash platform/spark.sh fetch` first"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[1]")
        .appName("deltabus-interop")
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={warehouse}")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.hadoop.fs.s3a.impl", "org.apache.hadoop.fs.s3a.S3AFileSystem")
        .config("spark.hadoop.fs.s3a.endpoint", endpoint)
        .config("spark.hadoop.fs.s3a.access.key", access_key)
        .config("spark.hadoop.fs.s3a.secret.key", secret_key)
        .config("spark.hadoop.fs.s3a.path.style.access", "true")
        .config(
            "spark.hadoop.fs.s3a.connection.ssl.enabled", str(endpoint.startswith("https")).lower()
        )
        .config(
            "spark.hadoop.fs.s3a.aws.credentials.provider",
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        )
        .config("spark.hadoop.fs.s3a.attempts.maximum", "3")
        .config("spark.hadoop.fs.s3a.retry.limit", "3")
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.ui.showConsoleProgress", "false")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
