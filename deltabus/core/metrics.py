"""Prometheus metrics of a deltabus process, served on request (prometheus-client).

Opt-in: with `deltabus --metrics-port N` or DELTABUS_METRICS_PORT, `GET /metrics` on
`0.0.0.0:N` answers in Prometheus' text format (on the health server when the two ports
are the same). The metrics are counted whether or not they are served; every one is
labelled with the process's `component` (producer, etl, consumer, transform, serve-postgres,
serve-opensearch), set once by the command that runs.

The metrics, their labels and meaning: docs/reference/metrics.md.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from deltabus.core import health
from deltabus.core.errors import ConfigError

log = logging.getLogger(__name__)

METRICS_PORT_VAR = "DELTABUS_METRICS_PORT"
REGISTRY = CollectorRegistry()
# Commits take milliseconds on a local store and up to seconds through an outage.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_component = "deltabus"
_served = False

RECORDS = Counter(
    "deltabus_records",
    "Records written (direction=out) or read (direction=in).",
    ["component", "table", "direction"],
    registry=REGISTRY,
)
BYTES = Counter(
    "deltabus_bytes",
    "Data file bytes written (out), or Arrow bytes of the records read (in).",
    ["component", "table", "direction"],
    registry=REGISTRY,
)
COMMITS = Counter(
    "deltabus_commits", "Commits that landed.", ["component", "table"], registry=REGISTRY
)
COMMIT_SECONDS = Histogram(
    "deltabus_commit_duration_seconds",
    "Time of one commit, its retries included.",
    ["component"],
    buckets=_SECONDS,
    registry=REGISTRY,
)
LATENCY = Histogram(
    "deltabus_end_to_end_latency_seconds",
    "From a record's commit to the moment this process read it.",
    ["component"],
    buckets=_SECONDS,
    registry=REGISTRY,
)
LAG_VERSIONS = Gauge(
    "deltabus_consumer_lag_versions",
    "Versions landed that the group has not committed, per partition table.",
    ["group", "table"],
    registry=REGISTRY,
)
LAG_RECORDS = Gauge(
    "deltabus_consumer_lag_records",
    "Records landed in the versions the group has not committed, per partition table.",
    ["group", "table"],
    registry=REGISTRY,
)
LAG_SECONDS = Gauge(
    "deltabus_consumer_lag_seconds",
    "Age of the newest commit read while the group is behind, per partition table.",
    ["group", "table"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "deltabus_storage_retries",
    "Storage calls retried: kind=outage (the store failed) or conflict (another writer).",
    ["component", "kind"],
    registry=REGISTRY,
)
FENCED = Counter(
    "deltabus_fenced",
    "Writers stopped because a newer writer claimed what they wrote.",
    ["component"],
    registry=REGISTRY,
)
TAKEOVERS = Counter(
    "deltabus_lease_takeovers",
    "Partition leases taken over from a member whose lease had lapsed.",
    ["component", "group"],
    registry=REGISTRY,
)


def set_component(name: str) -> None:
    """Name this process's part (the `component` label of everything counted after)."""
    global _component
    _component = name


def component() -> str:
    return _component


def served() -> bool:
    """Whether this process serves its metrics (what costs requests is measured only then)."""
    return _served


# Directories where child processes write their metrics (prometheus-client's multiprocess
# mode): a supervisor's /metrics shows its children's as well.
CHILDREN_VAR = "PROMETHEUS_MULTIPROC_DIR"
_children_dirs: list[str] = []


def children_dir(path: str) -> dict[str, str]:
    """Make this process's /metrics include what child processes given the returned
    environment count (they write under `path`; counters of children that ended stay).
    The supervisor names itself with a component of its own, so no sample is in both."""
    if path not in _children_dirs:
        _children_dirs.append(path)
    return {CHILDREN_VAR: path}


class _Merged:
    """This process's metrics and its children's, one family per name."""

    def collect(self) -> list[Any]:
        from prometheus_client import multiprocess

        families: dict[str, Any] = {}
        sources = [REGISTRY.collect()] + [
            multiprocess.MultiProcessCollector(None, path=d).collect() for d in _children_dirs
        ]
        for source in sources:
            for family in source:
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        return list(families.values())


def _scrape() -> health.Answer:
    if not _children_dirs:
        return 200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY)
    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged())  # type: ignore[arg-type]
    return 200, CONTENT_TYPE_LATEST, generate_latest(merged)


def serve(port: int) -> health.HealthServer:
    """Answer `GET /metrics` on `port` (the health server's, when it is the same port).

    Raises:
        ConfigError: the port is outside 1..65535 or cannot be bound.
    """
    global _served
    if not 1 <= port <= 65535:
        raise ConfigError(
            f"metrics port {port} is not a TCP port",
            f"give --metrics-port or {METRICS_PORT_VAR} a number from 1 to 65535",
        )
    running = health.running()
    server = running if running is not None and running.port == port else None
    if server is None:
        try:
            server = health.HealthServer(port)
        except ConfigError as exc:
            raise ConfigError(
                f"cannot serve metrics on port {port}: {exc.problem.split(': ', 1)[-1]}",
                f"choose a free port with --metrics-port or {METRICS_PORT_VAR}",
            ) from None
    server.add_route("/metrics", _scrape)
    _served = True
    log.debug("metrics on port %d (/metrics)", server.port)
    return server
