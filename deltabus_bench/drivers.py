"""The benchmark's backbones as drivers behind one protocol.

A driver sets up its pipeline (tables or topics, the ETL, the consumer, the producers)
in `start`, which hands the driving loop (`Bench.drive`, the same for every backbone)
a `Pipeline`; `finish` does what follows the loop while the pipeline still runs,
`stop` tears down whatever `start` got to, and `tables` returns what was produced and
what the consumer saw. Delta (deltabus_bench.delta.driver) and Kafka
(deltabus_bench.kafka.driver) are the drivers; `--etl spark` and `--serve`
are stages of the Delta one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# After the producers end, the loop waits for the consumer at most this x duration + 60 s.
MAX_DRAIN_WAIT_FACTOR = 2.0
# The probe sent after the idle window: a run id of its own, left out of the analysis.
AFTER_IDLE_RUN = "after-idle"

if TYPE_CHECKING:
    import pyarrow as pa

    from deltabus.adapters.serving.settings import ServingSettings
    from deltabus.core.processes import ChildProcess
    from deltabus.core.settings import Settings
    from deltabus_bench.config import BenchConfig
    from deltabus_bench.consumer import LiveStats
    from deltabus_bench.cost import RequestMeter
    from deltabus_bench.environment import CpuMeter
    from deltabus_bench.run_state import Drain, RunState
    from deltabus_bench.workload import ProducerHandle, ProducerSpec


@dataclass(frozen=True)
class DriverContext:
    """What a driver reads of the benchmark running it: the run's configuration and lake
    settings, its working directory, the processes it watches and the request meter."""

    cfg: BenchConfig
    settings: Settings
    serving: ServingSettings  # where --serve writes (a throwaway server when unset)
    work: Path  # logs and ready files
    bench_cpu_name: str  # the benchmark process's name in the CPU report
    minio_pid: int | None
    relay_pid: int | None  # the notify relay (--notify), else None
    proxy_pids: Mapping[str, int]  # the store profile's proxies
    minio_requests: RequestMeter | None  # None on a local-directory lake
    specs: Callable[..., list[ProducerSpec]]  # (backbone, rate, bootstrap="") -> specs


@dataclass
class Pipeline:
    """A running backbone as the driving loop sees it.

    `consumer` tails the output (`inserted`, `last_progress`, `error`); `etls` are the
    ETL processes the loop checks are alive; `drain(elapsed_s)` takes a backlog-drain
    step; `begin(start_ms)` is called with the schedule origin before any producer gets
    it; `requests` counts the store's requests over the produce phase.
    """

    handles: list[ProducerHandle]
    consumer: Any
    stats: LiveStats
    cpu: CpuMeter
    etls: list[ChildProcess]
    drain: Callable[[float], None] | None = None
    begin: Callable[[float], None] | None = None
    requests: RequestMeter | None = None


class Driver(Protocol):
    """One run of one backbone (module docstring)."""

    state: RunState  # what the run observed, filled in as it goes

    def start(self) -> Pipeline:
        """Set up the pipeline and start its producers' processes (not their schedule)."""
        ...

    def finish(self, pipeline: Pipeline) -> None:
        """What follows the driving loop while the pipeline still runs."""
        ...

    def stop(self) -> None:
        """Tear down whatever `start` set up, recording exit statuses as run errors."""
        ...

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """(messages produced, messages the consumer saw), after `stop`."""
        ...


def running_etls(etls: list[ChildProcess], drain: Drain | None) -> list[ChildProcess]:
    """The ETL processes that should be running now. A backlog drain takes process 0
    (`etls[0]`) down: stopped with SIGSTOP it stays alive; with SIGTERM it is gone until
    its restart is appended to `etls`."""
    if drain is None or drain.signal == "stop":
        return etls
    return etls[1:]


def json_lines(path: Path) -> list[dict]:
    """The JSON objects of a file of JSON lines, skipping lines that are not one."""
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    except OSError:
        pass
    return out
