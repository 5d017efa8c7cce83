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

- A partition dealt to another member: its child is stopped (SIGTERM, SIGKILL after
  `STOP_TIMEOUT_S`), then the lease is released, so the next holder never overlaps it.
- A lease lost (a renewal refused, or the lease ended before one landed): the child is
  killed at once. Whoever takes the partition claims its unified table, which fences any
  writer still running (deltabus.bus.fence), so output and input positions stay exactly
  once through every move.
- A child that exits on its own while its leases are held is restarted after a backoff
  (`BACKOFF_S`), unless it exited with status 2 without being fenced: an error no
  restart fixes (configuration, access, a corrupt input with --on-corrupt-file stop),
  which stops the replica with status 2.
- SIGTERM / SIGINT: the children stop, the leases are released and the member leaves, so
  the others take the partitions at their next step, well within the lease time.
- Children die with their replica (Linux: the parent-death signal); a replica killed
  outright loses its partitions within the lease time plus one step.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from deltabus.adapters.lease_children import (
    BACKOFF_S,
    FATAL_STATUS,
    STEADY_S,
    STOP_TIMEOUT_S,
    claimed_since,
    kill,
)
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.etl.config import EtlConfig
from deltabus.apps.timezones.layout import TimezoneLayout, ensure_layout, read_layout
from deltabus.bus.groups import DEFAULT_TTL_S, Group, Membership
from deltabus.core import health, metrics
from deltabus.core.errors import ConfigError, DeltabusError
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
MIN_TTL_S, MAX_TTL_S = 1.0, 600.0
LOOP_S = 0.1  # how often children are checked


@dataclass(frozen=True)
class LeaseConfig:
    """A lease replica's settings: the lease time, how held partitions map to children,
    and whether a spare child waits with Pathway loaded."""

    ttl_s: float = DEFAULT_TTL_S
    children: str = "per-batch"
    spare: bool = True

    def __post_init__(self) -> None:
        if not MIN_TTL_S <= self.ttl_s <= MAX_TTL_S:
            raise ConfigError(
                f"the lease time must be {MIN_TTL_S:g}..{MAX_TTL_S:g} s, got {self.ttl_s:g}",
                "give --lease-ttl-s 10 (the default) or another value in that range",
            )
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
class _Child:
    """One ETL child process and the partitions it runs."""

    partitions: frozenset[int]
    proc: subprocess.Popen
    ready_file: Path
    started: float  # monotonic, when it got its partitions
    started_wall: float
    stopping_since: float | None = None

    @property
    def label(self) -> str:
        return f"ETL child pid {self.proc.pid} (partitions {sorted(self.partitions)})"


@dataclass
class LeaseReport:
    group: str
    member: str
    children: str
    partitions: int
    takes: int = 0
    releases: int = 0
    lost: int = 0
    child_starts: int = 0
    spares_used: int = 0
    child_failures: int = 0
    held_most: int = 0  # the most partitions held at once
    elapsed_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class EtlSupervisor:
    """One `--lease` replica: a group member running ETL children for what it holds."""

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
        self.lake = lake
        self.layout = layout
        self.child_args = child_args
        self.config = config
        self.stop = stop or threading.Event()
        self.ready_file = ready_file
        self.verbose = verbose
        self.tables = layout.unified_tables
        self.membership = Membership(Group(lake, GROUP, config.ttl_s), self.tables)
        self.children: dict[frozenset[int], _Child] = {}
        self.spare: tuple[subprocess.Popen, Path] | None = None
        self.spare_started = -SPARE_EVERY_S
        self.spawned = 0
        self.run_dir = Path(tempfile.mkdtemp(prefix="deltabus-etl-lease-"))
        self.failures: dict[int, int] = {}  # consecutive failed children, by partition
        self.retry_at: dict[int, float] = {}  # monotonic time a partition may restart
        self.unwanted: set[str] = set()
        self.fatal: DeltabusError | None = None
        self.report = LeaseReport(GROUP, self.membership.member, config.children, layout.partitions)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> LeaseReport:
        """Hold partitions and run their ETL until `stop`, SIGTERM or SIGINT; then stop the
        children, release every lease and leave the group.

        Raises:
            DeltabusError: a child failed with an error no restart fixes (its own message
                is in the log above).
        """
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {
                s: signal.signal(s, self._request_stop) for s in (signal.SIGTERM, signal.SIGINT)
            }
        started = time.monotonic()
        log.info(
            "ETL replica %s joins group %s on %s (%d partitions, lease %gs, %s children%s)",
            self.membership.member,
            GROUP,
            self.lake.settings.describe(),
            self.layout.partitions,
            self.config.ttl_s,
            self.config.children,
            ", a spare" if self.config.spare else "",
        )
        try:
            self._loop()
            self._wind_down()
        finally:
            if self.spare is not None:
                _dismiss(self.spare[0])
            for child in self.children.values():  # only after a failure of the loop itself
                kill(child.proc)
            for s, handler in previous.items():
                signal.signal(s, handler)
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self.report.elapsed_s = round(time.monotonic() - started, 3)
        if self.fatal is not None:
            raise self.fatal
        return self.report

    def _request_stop(self, signum: int, _frame: object) -> None:
        log.info("signal %d: stopping the ETL children and leaving group %s", signum, GROUP)
        self.stop.set()

    def _loop(self) -> None:
        # Heartbeat first and deal one step later: replicas started together (a
        # Deployment's) then see each other before taking, and move no partition twice.
        self.membership.heartbeat()
        next_step = time.monotonic() + self.membership.tick_s
        while not self.stop.is_set():
            if time.monotonic() >= next_step:
                self._step()
                next_step = time.monotonic() + self.membership.tick_s
                self._mark_ready()
            self._drop_lapsed()
            self._reap()
            if not self.stop.is_set():
                self._converge()
            self.stop.wait(LOOP_S)

    def _wind_down(self) -> None:
        """Stop every child, keep the leases renewed meanwhile, then leave the group."""
        if self.spare is not None:
            _dismiss(self.spare[0])
            self.spare = None
        for child in self.children.values():
            self._terminate(child)
        next_step = 0.0
        while self.children:
            if time.monotonic() >= next_step:
                self._step()
                next_step = time.monotonic() + self.membership.tick_s
            self._reap()
            time.sleep(LOOP_S)
        self.report.releases += len(self.membership.held)
        self.membership.leave()
        log.info("ETL replica %s left group %s", self.membership.member, GROUP)

    def _step(self) -> None:
        try:
            changes = self.membership.step(take=not self.stop.is_set())
        except Exception as exc:  # noqa: BLE001 - an outage: leases lapse by the clock
            log.warning("group %s: step failed (%s); retrying", GROUP, exc)
            return
        self.report.takes += len(changes.taken)
        self.report.held_most = max(self.report.held_most, len(self.membership.held))
        self.unwanted = set(changes.unwanted)
        self._lost(changes.lost)

    def _drop_lapsed(self) -> None:
        now_ms = self.membership.group.now_ms()
        lapsed = [t for t, lease in self.membership.held.items() if lease.expires_ms <= now_ms]
        for table in lapsed:
            log.warning("group %s: the lease on %s ended before a renewal landed", GROUP, table)
            del self.membership.held[table]
        self._lost(lapsed)

    def _lost(self, tables: list[str]) -> None:
        """Kill at once every child running a partition whose lease is gone."""
        if not tables:
            return
        self.report.lost += len(tables)
        gone = {self._index(t) for t in tables}
        for child in self.children.values():
            if child.partitions & gone:
                log.warning("%s: lease lost, killing it", child.label)
                kill(child.proc)
                child.stopping_since = child.stopping_since or time.monotonic()

    # -- children ---------------------------------------------------------------------------

    def _index(self, table: str) -> int:
        return self.tables.index(table)

    def _converge(self) -> None:
        """Bring the children in line with the held partitions (`CHILD_MODES`)."""
        active = {self._index(t) for t in self.membership.held if t not in self.unwanted}
        for child in self.children.values():
            if child.partitions - active:  # runs a partition no longer its to run
                self._terminate(child)
        covered: set[int] = set().union(*self.children) if self.children else set()
        now = time.monotonic()
        free = {i for i in active - covered if now >= self.retry_at.get(i, 0.0)}
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
        for table in sorted(self.unwanted & set(self.membership.held)):
            if self._index(table) not in covered:
                self.membership.release(table)
                self.report.releases += 1
        self._keep_spare()

    def _renew(self, partitions: set[int]) -> bool:
        """Renew the leases of `partitions` before a child claims their tables: a child
        never starts on a lease another member may have taken meanwhile."""
        tables = [self.tables[i] for i in sorted(partitions)]
        renewed = [self.membership.renew(t) for t in tables if t in self.membership.held]
        if len(renewed) != len(tables) or not all(renewed):
            self._lost([t for t in tables if t not in self.membership.held])
            return False
        return True

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
        child = _Child(key, proc, ready, time.monotonic(), time.time())
        self.children[key] = child
        self.report.child_starts += 1
        log.info("%s runs as %s", child.label, how)

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
            if not c.ready_file.exists() and now - c.started < STEADY_S
        ]
        if not starting:
            self.spare = self._spawn(SPARE)
            self.spare_started = now

    def _terminate(self, child: _Child) -> None:
        if child.stopping_since is None:
            child.stopping_since = time.monotonic()
            log.info("stopping %s", child.label)
            try:
                child.proc.terminate()
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        for key, child in list(self.children.items()):
            status = child.proc.poll()
            if status is None:
                stopping = child.stopping_since
                if stopping is not None and time.monotonic() - stopping > STOP_TIMEOUT_S:
                    log.warning("%s did not stop in %.0fs; killing it", child.label, STOP_TIMEOUT_S)
                    kill(child.proc)
                continue
            del self.children[key]
            if child.stopping_since is not None or self.stop.is_set():
                log.info("%s stopped (status %d)", child.label, status)
                continue
            self._failed(child, status)

    def _failed(self, child: _Child, status: int) -> None:
        """A child exited by itself: restart it after a backoff, unless no restart can fix
        what stopped it."""
        self.report.child_failures += 1
        if status == FATAL_STATUS and not self._fenced(child):
            self.fatal = DeltabusError(
                f"the {child.label} stopped with status {status} on an error no restart "
                "fixes (its message is above); this ETL replica stopped and left group "
                f"{GROUP}, so the others take its partitions",
                "fix what the child's message says, then start this replica again",
            )
            log.error("%s", self.fatal.problem)
            self.stop.set()
            return
        ran = time.monotonic() - child.started
        delays = []
        for i in child.partitions:
            failures = 1 if ran >= STEADY_S else self.failures.get(i, 0) + 1
            self.failures[i] = failures
            delays.append(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1])
        delay = max(delays)
        for i in child.partitions:
            self.retry_at[i] = time.monotonic() + delay
        log.warning(
            "%s exited with status %d after %.1fs; restarting it in %gs while its leases are held",
            child.label,
            status,
            ran,
            delay,
        )

    def _fenced(self, child: _Child) -> bool:
        """True when a writer that started after `child` claimed one of its tables."""
        tables = [self.tables[i] for i in sorted(child.partitions)]
        return claimed_since(self.lake, tables, child.proc.pid, child.started_wall)

    def _mark_ready(self) -> None:
        """Report ready (health endpoint) once the replica has joined, and write the ready
        file: its pid, member id, and the directory of its children's ready files
        (`child-<n>.ready`, and a spare's `child-<n>.ready.spare` once it is loaded)."""
        health.mark_ready()
        if self.ready_file is None or self.ready_file.exists():
            return
        tmp = Path(f"{self.ready_file}.tmp")
        record = {"pid": os.getpid(), "member": self.membership.member, "group": GROUP}
        record |= {"mode": "continuous", "lease": True, "children_dir": str(self.run_dir)}
        tmp.write_text(json.dumps(record))
        tmp.replace(self.ready_file)


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
