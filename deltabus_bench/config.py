"""What a benchmark run measures: rates, duration, warm-up, commit profile, store profile,
scenarios."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from deltabus.apps.timezones.layout import PARTITIONERS
from deltabus.core.errors import ConfigError
from deltabus.core.intervals import parse_duration

BACKBONES = ("delta", "kafka")
# deltabus' ETL process; Spark Structured Streaming (spark_etl); a Kafka Streams topology
# (platform/kafka-streams-etl, on the Kafka backbone only).
ETLS = ("pathway", "spark", "kafka-streams")
# --serve: the serving sinks (deltabus_bench.serving) and the stores they serve into.
SERVE_SYSTEMS = {"postgres": "PostgreSQL", "opensearch": "OpenSearch"}
SERVER_CPU = {"postgres": "postgresql", "opensearch": "opensearch"}  # its server's CPU name
SERVE_BACKENDS = tuple(SERVE_SYSTEMS)


def parse_rates(text: str) -> tuple[int, ...]:
    """'10000,30000' or '10k,30k' -> (10000, 30000)."""
    rates = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        scale = 1
        if part.endswith("k"):
            part, scale = part[:-1], 1000
        try:
            value = float(part) * scale
        except ValueError:
            raise ConfigError(
                f"--rates: {part!r} is not a number", "e.g. --rates 10000,30000"
            ) from None
        if not value >= 1 or value != int(value):
            raise ConfigError(f"--rates: {value:g} is not a whole rate >= 1 msg/s")
        rates.append(int(value))
    if not rates:
        raise ConfigError("--rates is empty", "e.g. --rates 10000,30000")
    return tuple(rates)


def parse_profile(text: str) -> float:
    """'100ms' / '1000ms' / '1s' -> commit interval in seconds."""
    return parse_duration(text, "--profile")


def parse_backbones(text: str) -> tuple[str, ...]:
    text = text.strip().lower()
    if text == "both":
        return BACKBONES
    if text in BACKBONES:
        return (text,)
    raise ConfigError(f"--backbone {text!r} is not one of delta, kafka, both")


@dataclass(frozen=True)
class BenchConfig:
    rates: tuple[int, ...]
    duration: float
    warmup: float
    profile: str
    out: Path
    seed: int = 0
    backbones: tuple[str, ...] = ("delta",)
    producers: int = 1
    partitions: int = 1  # per stream (deltabus.apps.timezones.layout); the unified output alike
    etl_processes: int = 1  # ETL processes splitting the partitions
    partitioner: str = "sticky"  # how a new lake places messages (deltabus.apps.timezones.layout)
    producer_mode: str = "process"  # "process" or "inline"
    backlog_drain: float = 0.0  # seconds the ETL is down under load (0: no drain scenario)
    drain_signal: str = "term"  # "term": SIGTERM + restart; "stop": SIGSTOP + SIGCONT
    recovery_threshold: float = 1.0  # seconds: "latency back under" for the drain scenario
    soak: bool = False
    maintenance_interval: float = 60.0
    # Soak in windows (deltabus_bench.soak_windows): minutes after the warm-up, in windows
    # of `window_minutes`; 0: not a windowed soak.
    soak_minutes: float = 0.0
    window_minutes: float = 10.0
    vacuum_retention_hours: int | None = None  # None: max(24 h, 4 x the run)
    log_retention_s: int | None = None  # None: the lake settings' (DELTABUS_LOG_RETENTION_S)
    # Records' retention of the run's tables (inputs and unified), applied by the soak's
    # maintenance passes (deltabus.delta.retention); None: records are kept.
    retention_s: int | None = None
    grace: float = 20.0  # seconds without progress after the producer ends => lost
    consumer_poll_ms: float = 20.0
    etl_poll_ms: float | None = None  # None: the ETL's own default
    interval_s: float = 1.0  # bucket of the latency-over-time plots
    idle_s: float = 0.0  # after the run, measure the cost of the idle pipeline this long
    # Tails woken by MinIO's pushed commit events (a relay), not polls; None: on for a
    # throwaway MinIO on loopback (`notify_for`), off for a store profile or another store.
    notify: bool | None = None
    serve: str | None = None  # one of SERVE_BACKENDS: the serving sink as a stage
    serve_refresh_ms: int | None = None  # --serve opensearch: the index's refresh interval
    serve_in_flight: int | None = None  # --serve opensearch: batches in flight in the sink
    serve_replay: bool = False  # --serve: after the run, the sink alone loads the whole table
    store: str = "loopback"  # store profile: latency in front of MinIO (bench.store_profiles)
    etl: str = "pathway"  # the ETL between the tables: one of ETLS
    command: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.duration > 0:
            raise ConfigError(f"--duration must be positive, got {self.duration}")
        if not 0 <= self.warmup < self.duration:
            raise ConfigError(
                f"--warmup {self.warmup} must be >= 0 and shorter than --duration {self.duration}"
            )
        if self.producers < 1:
            raise ConfigError("--producers must be at least 1")
        if not 1 <= self.partitions <= 64:
            raise ConfigError(f"--partitions must be 1..64, got {self.partitions}")
        if not 1 <= self.etl_processes <= self.partitions:
            raise ConfigError(
                f"--etl-processes must be 1..{self.partitions} (at most one per partition), "
                f"got {self.etl_processes}"
            )
        if self.partitioner not in PARTITIONERS:
            raise ConfigError(
                f"--partitioner must be one of {', '.join(PARTITIONERS)}, got {self.partitioner!r}"
            )
        if self.producer_mode not in ("process", "inline"):
            raise ConfigError("--producer-mode must be process or inline")
        if self.backlog_drain < 0:
            raise ConfigError("--backlog-drain must be >= 0 seconds")
        need = self.warmup + 3 * self.backlog_drain + 15
        if self.backlog_drain and self.duration < need:
            raise ConfigError(
                f"--backlog-drain {self.backlog_drain:g} needs a longer run to show the recovery",
                f"use --duration >= warmup + 3 x drain + 15 = {need:g} s",
            )
        if self.drain_signal not in ("term", "stop"):
            raise ConfigError("--drain-signal must be term or stop")
        if self.maintenance_interval <= 0:
            raise ConfigError("--maintenance-interval must be positive")
        if self.vacuum_retention_hours is not None and self.vacuum_retention_hours < 1:
            raise ConfigError(
                f"--vacuum-retention-hours {self.vacuum_retention_hours} is below 1",
                "vacuum's retention is in whole hours; a shorter one could remove files that "
                "a lagging reader still needs",
            )
        if self.log_retention_s is not None and self.log_retention_s < 10:
            raise ConfigError(f"--log-retention-s must be at least 10, got {self.log_retention_s}")
        if self.retention_s is not None and self.retention_s < 60:
            raise ConfigError(
                f"--retention-s must be at least 60, got {self.retention_s}",
                "records younger than a reader's lag must stay in the tables",
            )
        self._check_windowed()
        if self.retention_s is not None and not self.maintenance:
            raise ConfigError(
                "--retention-s is applied by the maintenance passes of a soak",
                "add --soak or --soak-minutes",
            )
        if not 0 <= self.idle_s <= 3600:
            raise ConfigError("--idle-s must be 0..3600 seconds")
        if self.grace <= 0:
            raise ConfigError("--grace must be positive")
        if not 1 <= self.consumer_poll_ms <= 10_000:
            raise ConfigError("--poll-ms must be 1..10000")
        self._check_serve()
        from deltabus_bench.store_profiles import profile

        profile(self.store)  # a ConfigError naming the profiles when unknown
        for rate in self.rates:
            if rate % self.producers and rate / self.producers < 1:
                raise ConfigError(f"rate {rate} split over {self.producers} producers is < 1")
        self._check_etl()

    def _check_etl(self) -> None:
        """The ETL is one of ETLS; Spark runs only the plain Delta run (one partition),
        Kafka Streams only the plain Kafka run."""
        if self.etl not in ETLS:
            raise ConfigError(f"--etl {self.etl!r} is not one of {', '.join(ETLS)}")
        if self.etl == "kafka-streams":
            self._check_kafka_streams()
        if self.etl != "spark":
            return
        others = [
            name
            for name, on in (
                ("--partitions > 1", self.partitions > 1),
                ("--backbone kafka/both", "kafka" in self.backbones),
                ("--backlog-drain", self.backlog_drain > 0),
                ("--soak", self.soak),
                ("--soak-minutes", self.windowed),
                ("--idle-s", self.idle_s > 0),
            )
            if on
        ]
        if others:
            raise ConfigError(
                f"--etl spark runs the Delta benchmark on the unpartitioned layout only; "
                f"{', '.join(others)} is not supported with it",
                "drop those options, or use --etl pathway",
            )

    def _check_kafka_streams(self) -> None:
        others = [
            name
            for name, on in (
                ("--backbone delta/both", self.backbones != ("kafka",)),
                ("--partitions > 1", self.partitions > 1),
                ("--backlog-drain", self.backlog_drain > 0),
                ("--soak", self.soak),
                ("--soak-minutes", self.windowed),
                ("--idle-s", self.idle_s > 0),
                ("--serve", self.serve is not None),
            )
            if on
        ]
        if others:
            raise ConfigError(
                f"--etl kafka-streams runs the Kafka benchmark (--backbone kafka) only; "
                f"{', '.join(others)} is not supported with it",
                "use --backbone kafka without those options, or --etl pathway",
            )

    def _check_serve(self) -> None:
        if self.serve is not None and self.serve not in SERVE_BACKENDS:
            raise ConfigError(f"--serve {self.serve!r} is not one of {', '.join(SERVE_BACKENDS)}")
        if self.serve_replay and self.serve is None:
            raise ConfigError("--serve-replay measures the sink of --serve postgres|opensearch")
        if self.serve_in_flight is not None:
            if self.serve != "opensearch":
                raise ConfigError("--serve-in-flight sets the sink of --serve opensearch")
            if not 1 <= self.serve_in_flight <= 16:
                raise ConfigError(f"--serve-in-flight must be 1..16, got {self.serve_in_flight}")
        if self.serve_refresh_ms is None:
            return
        if self.serve != "opensearch":
            raise ConfigError("--serve-refresh-ms is the refresh interval of --serve opensearch")
        if not 1 <= self.serve_refresh_ms <= 60_000:
            raise ConfigError(f"--serve-refresh-ms must be 1..60000, got {self.serve_refresh_ms}")

    def _check_windowed(self) -> None:
        if self.soak_minutes < 0:
            raise ConfigError(f"--soak-minutes must be >= 0, got {self.soak_minutes:g}")
        if not self.windowed:
            return
        if not self.window_minutes > 0:
            raise ConfigError(f"--window-minutes must be positive, got {self.window_minutes:g}")
        ratio = self.soak_minutes / self.window_minutes
        if ratio < 2 - 1e-9 or abs(ratio - round(ratio)) > 1e-9:
            raise ConfigError(
                f"--soak-minutes {self.soak_minutes:g} is not a whole number (at least 2) of "
                f"--window-minutes {self.window_minutes:g}",
                "the goals compare the first window with the last: e.g. --soak-minutes 120 "
                "--window-minutes 10",
            )
        if abs(self.duration - (self.warmup + self.soak_minutes * 60)) > 1e-6:
            raise ConfigError("a windowed soak lasts --warmup + --soak-minutes; give no --duration")
        others = [
            name
            for name, on in (
                ("more than one rate", len(self.rates) > 1),
                ("--backbone kafka/both", self.backbones != ("delta",)),
                ("--backlog-drain", self.backlog_drain > 0),
                ("--idle-s", self.idle_s > 0),
                ("--serve", self.serve is not None),
            )
            if on
        ]
        if others:
            raise ConfigError(
                f"--soak-minutes runs one Delta rate with maintenance; {', '.join(others)} "
                "is not part of it"
            )

    @property
    def windowed(self) -> bool:
        """A soak in windows (`--soak-minutes`)."""
        return self.soak_minutes > 0

    @property
    def window_s(self) -> float:
        return self.window_minutes * 60

    @property
    def windows(self) -> int:
        """How many windows a windowed soak has."""
        return round(self.soak_minutes / self.window_minutes) if self.windowed else 0

    @property
    def maintenance(self) -> bool:
        """Lake maintenance runs beside the load (`--soak`, `--soak-minutes`)."""
        return self.soak or self.windowed

    @property
    def vacuum_hours(self) -> int:
        """Vacuum's retention: `--vacuum-retention-hours`, else 24 h or 4 x the run."""
        if self.vacuum_retention_hours is not None:
            return self.vacuum_retention_hours
        return math.ceil(max(24.0, self.duration / 3600 * 4))

    @property
    def commit_interval(self) -> float:
        return parse_profile(self.profile)

    @property
    def drain_at(self) -> float:
        """Seconds after the schedule start at which the ETL is taken down: a quarter of
        the post-warm-up time before it, the rest (minus the outage) for the recovery."""
        free = self.duration - self.warmup - self.backlog_drain
        return self.warmup + max(1.0, free / 4)
