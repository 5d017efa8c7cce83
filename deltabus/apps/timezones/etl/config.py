"""The ETL's settings (no Pathway here: `deltabus etl --lease` checks them before it
starts any Pathway program)."""

from __future__ import annotations

from dataclasses import dataclass

from deltabus.core.errors import ConfigError
from deltabus.core.intervals import (
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_POLL_INTERVAL_MS,
    check_interval,
)

# What the ETL does with an input data file that cannot be read as Parquet.
CORRUPT_FILE_ACTIONS = ("stop", "skip")


@dataclass(frozen=True)
class EtlConfig:
    bounded: bool = True
    commit_interval: float = DEFAULT_COMMIT_INTERVAL_MS / 1000
    poll_interval: float = DEFAULT_POLL_INTERVAL_MS / 1000
    expected_producers: int = 1
    # Bounded mode: stop at these producer runs' finish markers, not at a count of runs.
    until_runs: frozenset[str] = frozenset()
    # Pathway commits an output's inputs every tick_ms while rows are on their way to it,
    # none while idle (deltabus.apps.timezones.etl.ticker).
    tick_ms: int = 10
    threads: int = 1
    # This ETL is process `process` of `processes`, and owns the partitions i with
    # i mod processes == process (deltabus.apps.timezones.layout); 0 of 1 owns them all.
    process: int = 0
    processes: int = 1
    # Exactly these partitions instead (what `deltabus etl --lease` gives its children);
    # None: process and processes decide.
    only: tuple[int, ...] | None = None
    # Partitions per stream when the lake has no layout yet (an ETL started before its
    # producer); None: the lake's layout.
    partitions: int | None = None
    # An input data file that cannot be read as Parquet: "stop" (exit 2 naming the table,
    # the version and the file; nothing of that version is written) or "skip" (the file
    # is left out, logged and counted in `EtlReport.skipped_files`). None: the lake
    # settings' `on_corrupt_file` (DELTABUS_ON_CORRUPT_FILE).
    on_corrupt_file: str | None = None

    def __post_init__(self) -> None:
        check_interval(self.commit_interval, "commit interval")
        check_interval(self.poll_interval, "poll interval")
        if not 1 <= self.threads <= 64:
            raise ConfigError(f"threads must be 1..64, got {self.threads}")
        if self.expected_producers < 1:
            raise ConfigError("expected producers must be at least 1")
        if self.on_corrupt_file is not None and self.on_corrupt_file not in CORRUPT_FILE_ACTIONS:
            raise ConfigError(
                f"on corrupt file must be one of {', '.join(CORRUPT_FILE_ACTIONS)}, "
                f"got {self.on_corrupt_file!r}",
                "use --on-corrupt-file stop (the default) or --on-corrupt-file skip",
            )
