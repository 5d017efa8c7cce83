"""`deltabus bench`: the end-to-end latency benchmark harness.

Per rate: a fresh lake prefix, the ETL as its own process, an open-loop producer and a
consumer tailing `timezone_unified` that records when it first sees every message.
Samples go to a Delta table (`latency_samples`); DuckDB computes the percentiles with
`deltabus.apps.timezones.latency`. `--backbone kafka` runs the same workload over a real
Kafka broker.

Importing this package is cheap (the CLI registers the command from `command.py`); the
harness modules import Pathway, matplotlib and confluent-kafka only when a run needs them.
"""
