"""The same ETL over Kafka, for the side-by-side baseline (`deltabus bench --backbone kafka`).

Pathway reads topics timezone1/timezone2 with its own Kafka connector (no license key
needed, JSON format), parses `date` with the same strptime expression as the Delta ETL
(`deltabus.apps.timezones.etl.pipeline.DATE_FORMAT`, epoch ms), concatenates both streams and writes
topic `timezone_unified` with `pw.io.kafka.write` (JSON: timestamp, message, time, diff).

Run it as its own process, like the Delta ETL:

    python -m deltabus_bench.kafka.etl --bootstrap 127.0.0.1:9092 --ready-file F

It stops on SIGTERM / Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

INPUT_TOPICS = ("timezone1", "timezone2")
OUTPUT_TOPIC = "timezone_unified"


def build(bootstrap: str, group: str, ready_file: Path | None, autocommit_ms: int = 10):
    import pathway as pw

    from deltabus.apps.timezones.etl.pipeline import DATE_FORMAT
    from deltabus_bench.workload import KAFKA_LINGER_MS

    class InputSchema(pw.Schema):
        date: str
        message: str

    streams = [
        pw.io.kafka.read(
            {
                "bootstrap.servers": bootstrap,
                # One group per topic: two readers sharing a group would rebalance each
                # other and re-read (duplicates) on every rebalance.
                "group.id": f"{group}-{topic}",
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": "5",
            },
            topic=topic,
            schema=InputSchema,
            format="json",
            autocommit_duration_ms=autocommit_ms,
            name=f"kafka_{topic}",
        )
        for topic in INPUT_TOPICS
    ]
    unified = pw.Table.concat_reindex(*streams).select(
        timestamp=pw.this.date.dt.strptime(DATE_FORMAT).dt.timestamp(unit="ms"),
        message=pw.this.message,
    )
    pw.io.kafka.write(
        unified,
        {"bootstrap.servers": bootstrap, "linger.ms": str(KAFKA_LINGER_MS), "acks": "all"},
        topic_name=OUTPUT_TOPIC,
        format="json",
        name="kafka_timezone_unified",
    )
    if ready_file is not None:

        class Ready(pw.io.python.ConnectorSubject):
            """Touches the ready file once the dataflow runs (then closes; no rows)."""

            def run(self) -> None:
                ready_file.touch()

        class Empty(pw.Schema):
            x: int

        pw.io.null.write(pw.io.python.read(Ready(), schema=Empty, name="ready"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="host:port of the broker")
    parser.add_argument(
        "--group", default="deltabus-kafka-etl", help="consumer group id prefix (+ -<topic>)"
    )
    parser.add_argument("--ready-file", type=Path, help="created once the dataflow runs")
    parser.add_argument("--autocommit-ms", type=int, default=10, help="Pathway minibatch close")
    args = parser.parse_args(argv)
    from deltabus.core.logs import setup_logging

    setup_logging()
    import pathway as pw

    build(args.bootstrap, args.group, args.ready_file, args.autocommit_ms)
    log.info("Kafka ETL on %s: %s -> %s", args.bootstrap, INPUT_TOPICS, OUTPUT_TOPIC)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
