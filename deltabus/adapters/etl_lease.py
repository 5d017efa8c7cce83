"""`deltabus etl --mode continuous --lease`: ETL replicas that share the unified partitions
by leases in the lake, as a consumer group's members share a stream's.

Each replica (a supervisor that loads no Pathway itself) is a member of the group
`etl.timezone_unified` (deltabus.bus.groups.Membership): it heartbeats, takes the unified
partitions dealt to it when they are free or their lease has ended, renews them, and
releases those dealt to others. For the partitions it holds it runs the ETL as child
processes `deltabus etl --mode continuous --partition-list ...`, each its own
single-machine Pathway program, grouped as `LeaseConfig.children` says (`CHILD_MODES`).
A spare child (`--partition-list -`) waits with Pathway loaded, so a partition taken over
starts without Pathway's start-up time (docs/adr/0044-etl-partitions-by-lease.md).

Moves, lost leases, failed children and stops are handled as
deltabus.adapters.lease_supervisor says. Children die with their replica (Linux: the
parent-death signal); a replica killed outright loses its partitions within the lease
time plus one step.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from deltabus.adapters.lease_supervisor import (
    STEADY_S,
    Child,
    LeaseSupervisor,
    SupervisorReport,
    check_ttl,
    kill,
)
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.etl.config import EtlConfig
from deltabus.apps.timezones.layout import TimezoneLayout, ensure_layout, read_layout
from deltabus.bus.groups import DEFAULT_TTL_S
from deltabus.core import metrics
from deltabus.core.errors import ConfigError
from deltabus.core.processes import child_env
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

GROUP = f"etl.{UNIFIED_TABLE}"
# How held partitions map to children:
# - per-partition: one child per partition; a move starts or stops only that one;
# - per-set: one child for the whole held set, restarted whenever the set changes;
# - per-batch: one child per batch of partitions taken together; a child that must give
#   up a partition stops, and its other partitions restart together in a new child.
CHILD_MODES = ("per-partition", "per-set", "per-batch")
SPARE = "-"  # the --partition-list of a spare: read the partitions from stdin
SPARE_EVERY_S = 10.0  # at most one spare started per this many seconds


@dataclass(frozen=True)
class LeaseConfig:
    """A lease replica's settings: the lease time, how held partitions map to children,
    and whether a spare child waits with Pathway loaded."""

    ttl_s: float = DEFAULT_TTL_S
    children: str = "per-batch"
    spare: bool = True

    def __post_init__(self) -> None:
        check_ttl(self.ttl_s)
        if self.children not in CHILD_MODES:
            raise ConfigError(
                f"--lease-children must be one of {', '.join(CHILD_MODES)}, got {self.children!r}"
            )


def parse_partition_list(text: str) -> tuple[int, ...]:
    """`"0,2"` -> (0, 2): distinct partition indices (the ETL checks them against the
    lake's layout)."""
    try:
        found = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        found = ()
    if not found or found[0] < 0:
        raise ConfigError(
            f"--partition-list {text!r} is not a list of partition indices",
            "give comma-separated numbers from 0, e.g. --partition-list 0,2",
        )
    return found


def await_partitions(ready_file: Path | None) -> tuple[int, ...] | None:
    """A spare's partitions: one line of its stdin; None when stdin closes first (the
    replica dismissed it). Creates `<ready_file>.spare` first: the spare is loaded."""
    if ready_file is not None:
        spare_file(ready_file).write_text(str(os.getpid()))
    line = sys.stdin.readline().strip()
    return parse_partition_list(line) if line else None


def spare_file(ready_file: Path) -> Path:
    """The file a spare creates once it has loaded Pathway and waits for partitions."""
    return Path(f"{ready_file}.spare")


def follow_parent(parent_pid: int) -> None:
    """Have this process receive SIGTERM when its parent `parent_pid` dies (Linux), and
    stop at once if the parent is already gone, so a child never outlives its replica."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        raise ConfigError(
            f"the ETL replica (pid {parent_pid}) that started this ETL is gone",
            "--parent-pid is for the children of `deltabus etl --lease`; leave it out",
        )


@dataclass
class LeaseReport(SupervisorReport):
    children: str = ""
    spares_used: int = 0


class EtlSupervisor(LeaseSupervisor):
    """One `--lease` replica: a group member running ETL children for what it holds."""

    kind = "ETL"
    report: LeaseReport

    def __init__(
        self,
        lake: Lake,
        layout: TimezoneLayout,
        child_args: list[str],
        config: LeaseConfig,
        *,
        stop: threading.Event | None = None,
        ready_file: Path | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(
            lake, GROUP, layout.unified_tables, config.ttl_s, stop=stop, ready_file=ready_file
        )
        self.layout = layout
        self.child_args = child_args
        self.config = config
        self.verbose = verbose
        self.spare: tuple[subprocess.Popen, Path] | None = None
        self.spare_started = -SPARE_EVERY_S
        self.spawned = 0
        self.run_dir = Path(tempfile.mkdtemp(prefix="deltabus-etl-lease-"))
        self.report = LeaseReport(
            GROUP, self.membership.member, layout.partitions, children=config.children
        )

    def _joined(self) -> str:
        return (
            f"ETL replica {self.membership.member} joins group {GROUP} on "
            f"{self.lake.settings.describe()} ({self.layout.partitions} partitions, lease "
            f"{self.config.ttl_s:g}s, {self.config.children} children"
            f"{', a spare' if self.config.spare else ''})"
        )

    def _ready_record(self) -> dict:
        """Also the directory of the children's ready files (`child-<n>.ready`, and a
        spare's `child-<n>.ready.spare` once it is loaded)."""
        record = super()._ready_record()
        return record | {"mode": "continuous", "lease": True, "children_dir": str(self.run_dir)}

    def _winding_down(self) -> None:
        if self.spare is not None:
            _dismiss(self.spare[0])
            self.spare = None

    def _closed(self) -> None:
        self._winding_down()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _converge(self) -> None:
        """Bring the children in line with the held partitions (`CHILD_MODES`)."""
        active = self._active()
        for child in self.children.values():
            if child.partitions - active:  # runs a partition no longer its to run
                self._terminate(child)
        covered: set[int] = set().union(*self.children) if self.children else set()
        free = {i for i in active - covered if self._may_start(i)}
        if free and self.config.children == "per-set" and self.children:
            for child in self.children.values():  # restarted with the whole set
                self._terminate(child)
            free = set()
        if free and self._renew(free):
            if self.config.children == "per-partition":
                for i in sorted(free):
                    self._start(frozenset({i}))
            else:
                self._start(frozenset(free))
            covered |= free
        self._release_unwanted(covered)
        self._keep_spare()

    def _spawn(self, partitions: str) -> tuple[subprocess.Popen, Path]:
        """Start `deltabus etl` for `partitions` ("0,2", or `SPARE`: a spare that reads
        them from its stdin once it has loaded Pathway)."""
        self.spawned += 1
        ready = self.run_dir / f"child-{self.spawned}.ready"
        command = [
            sys.executable,
            "-m",
            "deltabus",
            *(["--verbose"] if self.verbose else []),
            "etl",
            *("--mode", "continuous", "--partition-list", partitions),
            *("--parent-pid", str(os.getpid()), "--ready-file", str(ready)),
            *self.child_args,
        ]
        # stdout too goes to stderr: this replica's stdout carries its own report only.
        extra = {}
        if metrics.served():  # the children's counts show on this replica's /metrics
            extra = metrics.children_dir(str(self._metrics_dir()))
        proc = subprocess.Popen(
            command,
            env=child_env(self.lake.settings, extra),
            stdout=sys.stderr.fileno(),
            stdin=subprocess.PIPE if partitions == SPARE else subprocess.DEVNULL,
        )
        return proc, ready

    def _metrics_dir(self) -> Path:
        path = self.run_dir / "metrics"
        path.mkdir(exist_ok=True)
        return path

    def _start(self, key: frozenset[int]) -> None:
        listed = ",".join(str(i) for i in sorted(key))
        spare, self.spare = self.spare, None
        how = "the spare"
        if spare is not None and _hand(spare[0], listed):
            proc, ready = spare
            self.report.spares_used += 1
            if not spare_file(ready).exists():
                how = "the spare (still loading)"
        else:
            if spare is not None:
                _dismiss(spare[0])
            proc, ready = self._spawn(listed)
            how = "a new process"
        self._add_child(Child("ETL child", key, proc, time.monotonic(), time.time(), ready), how)

    def _keep_spare(self) -> None:
        """Keep one spare waiting; started once no child is starting (so it never slows
        one that is taking over), and at most once per `SPARE_EVERY_S`."""
        if not self.config.spare:
            return
        if self.spare is not None:
            if self.spare[0].poll() is None:
                return
            log.warning("the spare ETL child exited (status %s)", self.spare[0].returncode)
            self.spare = None
        now = time.monotonic()
        if now - self.spare_started < SPARE_EVERY_S:
            return
        starting = [
            c
            for c in self.children.values()
            if c.ready_file is not None and not c.ready_file.exists() and now - c.started < STEADY_S
        ]
        if not starting:
            self.spare = self._spawn(SPARE)
            self.spare_started = now


def _hand(proc: subprocess.Popen, listed: str) -> bool:
    """Give a spare its partitions; False when it is gone."""
    if proc.poll() is not None or proc.stdin is None:
        return False
    try:
        proc.stdin.write(f"{listed}\n".encode())
        proc.stdin.close()
    except OSError:
        return False
    return True


def _dismiss(proc: subprocess.Popen) -> None:
    """End a spare: closing its stdin ends it with status 0; SIGTERM in case it is busy."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.terminate()
        proc.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        kill(proc)


def lease_etl(
    lake: Lake,
    config: EtlConfig,
    child_args: list[str],
    lease: LeaseConfig,
    ready_file: Path | None = None,
) -> dict:
    """Run one `--lease` replica of the continuous ETL `config` until SIGTERM / SIGINT;
    `child_args` are the `deltabus etl` options every child gets. Returns its report."""
    layout = ensure_layout(lake, config.partitions) if config.partitions else read_layout(lake)
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
    metrics.set_component("etl-lease")  # its children count as `etl`
    supervisor = EtlSupervisor(
        lake, layout, child_args, lease, ready_file=ready_file, verbose=verbose
    )
    return supervisor.run().as_dict()
