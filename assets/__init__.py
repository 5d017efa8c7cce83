"""Dagster definitions of deltabus, one package per domain, each with its own `defs`
(merged in definitions.py): pipeline, service, streams, serving, latency, benchmark and
maintenance."""
