"""The same ETL over Kafka as a Kafka Streams topology (`deltabus bench --backbone kafka
--etl kafka-streams`).

platform/kafka-streams-etl/src/deltabus/bench/TimezoneEtl.java reads topics timezone1 and
timezone2 (the JSON values the Kafka producer writes), parses `date` with its UTC offset
into epoch milliseconds (microsecond precision, the value the Pathway ETL's
`strptime(DATE_FORMAT).timestamp(unit="ms")` gives), and writes the union of both to topic
timezone_unified as the JSON the Kafka consumer reads (timestamp, message, time: the wall
clock in epoch ms when processed, diff: 1). It runs with
`processing.guarantee=exactly_once_v2` and `commit.interval.ms` = the run's commit
interval (--profile), one stream thread, the producer's `linger.ms` of the Kafka backbone.

platform/kafka-streams.sh fetches org.apache.kafka:kafka-streams (KAFKA_STREAMS_VERSION,
default 4.3.1) with Maven into the cache and compiles the topology there with javac
(`make kafka-jars` does both); `run` execs the JVM, so the child's pid is the ETL's JVM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from deltabus.core.paths import platform_script

SETUP_HINT = "needs Java 17 (javac) and Maven: run `make kafka-jars` once"


def script() -> Path:
    explicit = os.environ.get("DELTABUS_KAFKA_STREAMS_SH")
    if explicit:
        return Path(explicit)
    return platform_script("kafka-streams.sh")


def require() -> None:
    """Build the topology (cached: fetches and compiles only when missing); a ConfigError
    naming what is missing when that fails."""
    from deltabus.core.errors import ConfigError

    for tool in ("java", "javac", "mvn"):
        if shutil.which(tool) is None:
            raise ConfigError(f"--etl kafka-streams: {tool!r} is not on PATH", SETUP_HINT)
    proc = subprocess.run(
        ["bash", str(script()), "build"], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ConfigError(
            f"--etl kafka-streams: building the Kafka Streams ETL failed: {' '.join(tail)}",
            SETUP_HINT,
        )


def command(bootstrap: str, application_id: str, commit_ms: int, ready_file: Path) -> list[str]:
    """The ETL child's command line (its consumer group is `application_id`)."""
    from deltabus_bench.workload import KAFKA_LINGER_MS

    return [
        "bash",
        str(script()),
        "run",
        "--bootstrap",
        bootstrap,
        "--application-id",
        application_id,
        "--commit-interval-ms",
        str(commit_ms),
        "--linger-ms",
        str(KAFKA_LINGER_MS),
        "--ready-file",
        str(ready_file),
    ]
