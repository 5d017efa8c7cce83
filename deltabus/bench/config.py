"""What a benchmark run measures: rates, duration, warm-up, commit profile, store profile,
scenarios."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from deltabus.errors import ConfigError
from deltabus.intervals import parse_duration

BACKBONES = ("delta", "kafka")


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
    partitions: int = 1  # per stream (deltabus.partitions); the unified output alike
    etl_processes: int = 1  # ETL processes splitting the partitions
    producer_mode: str = "process"  # "process" or "inline"
    backlog_drain: float = 0.0  # seconds the ETL is down under load (0: no drain scenario)
    drain_signal: str = "term"  # "term": SIGTERM + restart; "stop": SIGSTOP + SIGCONT
    recovery_threshold: float = 1.0  # seconds: "latency back under" for the drain scenario
    soak: bool = False
    maintenance_interval: float = 60.0
    grace: float = 20.0  # seconds without progress after the producer ends => lost
    consumer_poll_ms: float = 20.0
    etl_poll_ms: float | None = None  # None: the ETL's own default
    interval_s: float = 1.0  # bucket of the latency-over-time plots
    idle_s: float = 0.0  # after the run, measure the cost of the idle pipeline this long
    notify: bool = False  # tails woken by MinIO's pushed commit events (a relay), not polls
    serve: str | None = None  # "postgres": the serving sink as a stage (deltabus.bench.serving)
    store: str = "loopback"  # store profile: latency in front of MinIO (bench.store_profiles)
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
        if not 0 <= self.idle_s <= 3600:
            raise ConfigError("--idle-s must be 0..3600 seconds")
        if self.grace <= 0:
            raise ConfigError("--grace must be positive")
        if not 1 <= self.consumer_poll_ms <= 10_000:
            raise ConfigError("--poll-ms must be 1..10000")
        if self.serve not in (None, "postgres"):
            raise ConfigError(f"--serve {self.serve!r} is not postgres")
        from deltabus.bench.store_profiles import profile

        profile(self.store)  # a ConfigError naming the profiles when unknown
        for rate in self.rates:
            if rate % self.producers and rate / self.producers < 1:
                raise ConfigError(f"rate {rate} split over {self.producers} producers is < 1")

    @property
    def commit_interval(self) -> float:
        return parse_profile(self.profile)

    @property
    def drain_at(self) -> float:
        """Seconds after the schedule start at which the ETL is taken down: a quarter of
        the post-warm-up time before it, the rest (minus the outage) for the recovery."""
        free = self.duration - self.warmup - self.backlog_drain
        return self.warmup + max(1.0, free / 4)
