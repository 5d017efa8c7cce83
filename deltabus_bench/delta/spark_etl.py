"""The same ETL as a Spark Structured Streaming job, the peer in `deltabus bench --etl spark`.

Delta Spark's streaming source reads timezone1 and timezone2 (their change data feed when
the table has it enabled, as deltabus creates them: inserts and update post-images count
+1, deletes and update pre-images -1; a table without it is read as an append-only Delta
stream, +1 per row), the two streams are unioned, `date` becomes `timestamp` (the double
nearest to the date's epoch milliseconds, by the contract's date grammar,
deltabus.apps.timezones.etl.dates) and each row gets `time`, the wall clock (epoch ms) when Spark
transformed it. Rows whose `date` the grammar rejects are left out (the Pathway ETL
writes them to timezone_rejects). Delta's streaming sink appends the result to
timezone_unified, one commit per micro-batch, with a checkpoint location on local disk
and a `processingTime` trigger of the run's commit profile.

Run it as its own process, like the Delta ETL (pyspark, Java 17 and the Delta/s3a jars
of `make spark` are needed; nothing else in deltabus imports pyspark):

    python -m deltabus_bench.delta.spark_etl --trigger-ms 100 --checkpoint DIR --ready-file F

The lake comes from the DELTABUS_* environment. It stops on SIGTERM / Ctrl-C and prints
its report (how each input is read, micro-batches and their durations) as one
JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from deltabus.core.paths import platform_script

log = logging.getLogger(__name__)

SPARK_SH = platform_script("spark.sh")
SETUP_HINT = (
    "run `make spark` once: it installs the spark dependency group (pyspark, delta-spark) "
    "and caches the Delta and s3a jars (bash platform/spark.sh fetch); Java 17 must be on PATH"
)

# The contract's date grammar (deltabus.apps.timezones.etl.dates.DATE_PATTERN) as a Java
# regex: numbered groups, and `\z` for the end of the text (Java's `$` also matches
# before a final newline).
JAVA_DATE_PATTERN = (
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,9}))?"
    r" (?:(Z)|([+-])([0-9]{2})(?:([0-9]{2})([0-9]{2})?|:([0-9]{2})(?::([0-9]{2}))?))\z"
)
# The groups in one string, split again on `|` (no group can hold one); Java appends
# nothing for a group that did not take part.
PARTS = "|".join(f"${i}" for i in range(1, 15))
# Change types of Delta's change data feed and the unified contract's `diff` of each.
CHANGE_DIFF = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


def spark_jars() -> list[str] | None:
    """The cached Delta + s3a jars, or None when `platform/spark.sh fetch` has not run."""
    if not SPARK_SH.is_file():
        return None
    done = subprocess.run(["bash", str(SPARK_SH), "jars"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return done.stdout.strip().split(",")


def missing() -> str | None:
    """Why the Spark ETL cannot start here, or None when it can; imports nothing of Spark."""
    if importlib.util.find_spec("pyspark") is None:
        return "python package pyspark is not installed"
    if shutil.which("java") is None:
        return "no java on PATH"
    if spark_jars() is None:
        return "the Delta and s3a jars are not cached"
    return None


def require() -> None:
    """Raise a ConfigError saying how to set Spark up when `missing()` finds a gap."""
    from deltabus.core.errors import ConfigError

    why = missing()
    if why is not None:
        raise ConfigError(f"--etl spark needs Delta Spark: {why}", SETUP_HINT)


def spark_path(lake: Any, table: str) -> str:
    """The path Spark opens for `table`: s3a:// on MinIO, the directory on a local lake."""
    uri = lake.uri(table)
    return uri if lake.is_local else uri.replace("s3://", "s3a://", 1)


def change_data_feed(lake: Any, table: str) -> bool:
    """Whether `table` has the change data feed enabled (its current table properties)."""
    configuration = lake.open(table).metadata().configuration or {}
    return str(configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"


def session(settings: Any, jars: list[str]) -> Any:
    """A local[1] SparkSession with Delta's extensions and s3a pointed at the lake's store.

    The credentials reach s3a through this process's environment, which the JVM inherits:
    pyspark puts every configuration value on the JVM's command line.
    """
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[1]")
        .appName("deltabus-bench-spark-etl")
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.databricks.delta.snapshotPartitions", "1")
    )
    if settings.storage != "local":
        from deltabus.delta.lake import Lake

        access = Lake(settings).access
        os.environ.update(access.spark_env())
        for key, value in access.spark_conf().items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def transform(rows: Any) -> Any:
    """`rows` (date, message, diff) as the unified contract (timestamp, message, time,
    diff): rows whose `date` the contract's grammar and range reject
    (deltabus.apps.timezones.etl.dates) are left out; `timestamp` is the double nearest to
    the date's epoch milliseconds.

    One regex pass puts the date's parts in an array; integer arithmetic gives epoch
    nanoseconds, then one correctly rounded division (below 2**53 ns) or whole
    milliseconds plus the rounded sub-millisecond part (above), as
    deltabus.apps.timezones.etl.dates.epoch_ms does: Spark's own timestamps stop at microseconds.
    """
    from pyspark.sql import functions as F

    from deltabus.apps.timezones.etl.dates import MAX_EPOCH_S, MIN_EPOCH_S

    date = F.col("date")
    parts = F.split(F.regexp_replace(date, JAVA_DATE_PATTERN, PARTS), r"\|", -1)
    g = [f"_p[{i}]" for i in range(14)]  # the 14 groups of JAVA_DATE_PATTERN

    def number(*texts: str) -> str:
        present = ", ".join(f"nullif({t}, '')" for t in texts)
        return f"CAST(coalesce({present}, '0') AS BIGINT)"

    h, mi, s = number(g[3]), number(g[4]), number(g[5])
    oh, om, os_ = number(g[9]), number(g[10], g[12]), number(g[11], g[13])
    day = f"make_date(CAST({g[0]} AS INT), CAST({g[1]} AS INT), CAST({g[2]} AS INT))"
    sign = f"(CASE WHEN {g[8]} = '-' THEN -1 ELSE 1 END)"
    epoch_s = (
        f"CAST(unix_date({day}) AS BIGINT) * 86400 + {h} * 3600 + {mi} * 60 + {s} "
        f"- {sign} * ({oh} * 3600 + {om} * 60 + {os_})"
    )
    # make_date is null for a day its month does not have (Spark's default, non-ANSI mode).
    accepted = (
        f"_matched AND {day} IS NOT NULL AND {h} <= 23 AND {mi} <= 59 AND {s} <= 59 "
        f"AND {oh} <= 23 AND {om} <= 59 AND {os_} <= 59 "
        f"AND _s >= {MIN_EPOCH_S} AND _s < {MAX_EPOCH_S}"
    )
    fraction_ns = f"CAST(rpad({g[6]}, 9, '0') AS BIGINT)"
    rest = "pmod(_ns, 1000000)"
    ms = (
        f"CASE WHEN abs(_ns) < {2**53} THEN CAST(_ns AS DOUBLE) / 1000000D "
        f"ELSE CAST((_ns - {rest}) div 1000000 AS DOUBLE) + CAST({rest} AS DOUBLE) / 1000000D END"
    )
    # Evaluated per row when the row is transformed (reflect is non-deterministic), unlike
    # current_timestamp(), which is the micro-batch's planned start for every row.
    now_ms = "CAST(reflect('java.lang.System', 'currentTimeMillis') AS BIGINT)"
    return (
        rows.select(
            "message", "diff", date.rlike(JAVA_DATE_PATTERN).alias("_matched"), parts.alias("_p")
        )
        .select("message", "diff", "_matched", "_p", F.expr(epoch_s).alias("_s"))
        .where(F.expr(accepted) & F.col("diff").isNotNull())
        .select("message", "diff", F.expr(f"_s * 1000000000 + {fraction_ns}").alias("_ns"))
        .select(
            F.expr(ms).alias("timestamp"),
            F.col("message"),
            F.expr(now_ms).alias("time"),
            F.col("diff"),
        )
    )


def input_stream(spark: Any, lake: Any, table: str) -> tuple[Any, str]:
    """`table` as a stream of (date, diff), and how it is read: "change data feed" or
    "append-only"."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("delta")
    if change_data_feed(lake, table):
        stream = reader.option("readChangeFeed", "true").load(spark_path(lake, table))
        diff = F.lit(None).cast("long")
        for change, value in CHANGE_DIFF.items():
            diff = F.when(F.col("_change_type") == change, F.lit(value)).otherwise(diff)
        return stream.select("date", "message", diff.alias("diff")), "change data feed"
    stream = reader.load(spark_path(lake, table))
    return stream.select("date", "message", F.lit(1).cast("long").alias("diff")), "append-only"


def start_query(spark: Any, lake: Any, trigger_ms: int, checkpoint: Path) -> tuple[Any, dict]:
    """Start the streaming query; returns it and how each input is read."""
    from deltabus.apps.timezones.contracts import INPUT_TABLES, UNIFIED_TABLE

    streams, sources = [], {}
    for table in INPUT_TABLES:
        stream, how = input_stream(spark, lake, table)
        streams.append(stream)
        sources[table] = how
    # One data file per commit, as the Pathway ETL writes.
    out = transform(streams[0].unionByName(streams[1])).coalesce(1)
    query = (
        out.writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .queryName("deltabus_timezone_unified")
        .start(spark_path(lake, UNIFIED_TABLE))
    )
    return query, sources


def wait_started(query: Any, stop: threading.Event, timeout: float = 300) -> None:
    """Return once the query has planned its first micro-batch (or reported progress),
    so that nothing the producers write waits behind the query's start-up."""
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        if query.exception() is not None or not query.isActive:
            return
        status = query.status
        waiting = str(status.get("message", "")).startswith("Waiting for")
        if query.lastProgress is not None or (waiting and not status.get("isTriggerActive")):
            return
        time.sleep(0.1)


def run(
    lake: Any, trigger_ms: int, checkpoint: Path, ready_file: Path | None, stop: threading.Event
) -> dict:
    """Run the query until `stop`; returns the report: how each input is read, the
    micro-batches and their durations (the first includes the query's start-up)."""
    jars = spark_jars()
    if jars is None:
        require()
    started = time.monotonic()
    spark = session(lake.settings, jars or [])
    query, sources = start_query(spark, lake, trigger_ms, checkpoint)
    log.info("Spark ETL: %s -> timezone_unified, trigger %d ms", sources, trigger_ms)
    wait_started(query, stop)
    startup_s = round(time.monotonic() - started, 2)
    if ready_file is not None:
        tmp = Path(f"{ready_file}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "etl": "spark", "mode": "continuous"}))
        tmp.replace(ready_file)
    batches: dict[int, dict[str, int]] = {}  # micro-batch id -> its durations (ms) by phase
    last_record = 0.0
    failure = None
    while not stop.is_set():
        if query.awaitTermination(0.5):
            failure = query.exception()
            break
        if time.monotonic() - last_record > 5:  # recentProgress holds the last 100 batches
            _record(query, batches)
            last_record = time.monotonic()
    _record(query, batches)
    if query.isActive:
        query.stop()
    spark.stop()
    if failure is not None:
        raise RuntimeError(f"the Spark streaming query failed: {failure}")
    return {
        "etl": "spark",
        "sources": sources,
        "trigger_ms": trigger_ms,
        "startup_s": startup_s,
        "micro_batches": max(batches, default=-1) + 1,
        "batches_over_trigger": sum(
            1 for b in batches.values() if b.get("triggerExecution", 0) > trigger_ms
        ),
        "batch_ms_median": _medians(list(batches.values())[1:]),  # after the first
    }


def _record(query: Any, batches: dict[int, dict[str, int]]) -> None:
    """Record the phase durations of each micro-batch Spark still reports. (Its input row
    counts are not kept: Spark cannot attribute them to a change data feed source, whose
    logical plan has more leaves than the executed one, and reports 0.)"""
    for progress in query.recentProgress:
        durations = progress.get("durationMs") or {}
        batches[int(progress["batchId"])] = {k: int(v) for k, v in durations.items()}


def _medians(batches: list[dict[str, int]]) -> dict[str, int]:
    """Per phase (latestOffset, getBatch, queryPlanning, addBatch, ..., triggerExecution),
    the median duration over `batches`, in ms."""
    phases = sorted({k for b in batches for k in b})
    out = {}
    for phase in phases:
        values = sorted(b[phase] for b in batches if phase in b)
        out[phase] = values[len(values) // 2]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trigger-ms", type=int, default=100, help="processingTime trigger")
    parser.add_argument(
        "--checkpoint", type=Path, required=True, help="the query's checkpoint location"
    )
    parser.add_argument("--ready-file", type=Path, help="created once the query runs")
    args = parser.parse_args(argv)
    from deltabus.core.logs import setup_logging
    from deltabus.core.settings import load_settings
    from deltabus.delta.lake import Lake

    setup_logging()
    why = missing()
    if why is not None:
        print(f"deltabus spark ETL: {why}\n  fix: {SETUP_HINT}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping the query", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    report = run(Lake(load_settings()), args.trigger_ms, args.checkpoint, args.ready_file, stop)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
