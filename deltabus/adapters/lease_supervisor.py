"""What the lease supervisors (`deltabus etl --lease`, `deltabus link --lease`) share: a
member of a group in the lake (deltabus.bus.groups.Membership) that runs child processes
for the partitions it holds.

- A partition dealt to another member: the child running it is stopped (SIGTERM, SIGKILL
  after `STOP_TIMEOUT_S`), then the lease is released, so the next holder never
  overlaps it.
- A lease lost (a renewal refused, or the lease ended before one landed): the child is
  killed at once. Whoever takes the partition claims its table, which fences any writer
  still running (deltabus.bus.fence), so every move is exactly once.
- A child that exits on its own while its leases are held is restarted after a backoff
  (`BACKOFF_S`), unless it exited with status 2 without being fenced: an error no
  restart fixes, which stops the replica with status 2.
- SIGTERM / SIGINT: the children stop, the leases are released and the member leaves, so
  the others take the partitions at their next step, well within the lease time.

How held partitions map to children is each supervisor's own (`_converge`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from deltabus.bus.fence import current_epoch, epoch_owner
from deltabus.bus.groups import Group, Membership
from deltabus.core import health
from deltabus.core.errors import ConfigError, DeltabusError
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

MIN_TTL_S, MAX_TTL_S = 1.0, 600.0
STOP_TIMEOUT_S = 20.0  # a child told to stop is killed after this
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # before restarting a failed child, by failures
STEADY_S = 60.0  # a child that ran this long before failing starts its backoff afresh
FATAL_STATUS = 2  # `deltabus`'s status for an error the user must fix
LOOP_S = 0.1  # how often children are checked


def check_ttl(ttl_s: float) -> float:
    """`ttl_s` when it is a usable lease time; ConfigError otherwise."""
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise ConfigError(
            f"the lease time must be {MIN_TTL_S:g}..{MAX_TTL_S:g} s, got {ttl_s:g}",
            "give --lease-ttl-s 10 (the default) or another value in that range",
        )
    return ttl_s


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` unless it already ended."""
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def claimed_since(lake: Lake, tables: list[str], pid: int, started_wall: float) -> bool:
    """True when a writer other than process `pid` of this host, started after
    `started_wall` (epoch s), holds the newest fencing claim of one of `tables`."""
    host = socket.gethostname()
    for table in tables:
        try:
            dt = lake.open(table)
            owner = epoch_owner(dt, current_epoch(dt)) or {}
        except Exception:  # noqa: BLE001 - unreadable now: not known to be fenced
            continue
        ours = owner.get("pid") == pid and owner.get("host") == host
        if not ours and float(owner.get("started", 0)) > started_wall:
            return True
    return False


@dataclass
class Child:
    """One child process and the partitions it runs."""

    kind: str  # "ETL child", "link child"
    partitions: frozenset[int]
    proc: subprocess.Popen
    started: float  # monotonic, when it got its partitions
    started_wall: float
    ready_file: Path | None = None
    stopping_since: float | None = None

    @property
    def label(self) -> str:
        return f"{self.kind} pid {self.proc.pid} (partitions {sorted(self.partitions)})"


@dataclass
class SupervisorReport:
    group: str
    member: str
    partitions: int
    takes: int = 0
    releases: int = 0
    lost: int = 0
    child_starts: int = 0
    child_failures: int = 0
    held_most: int = 0  # the most partitions held at once
    elapsed_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class LeaseSupervisor:
    """One replica: a group member running children for the partitions it holds (see
    the module docstring). Subclasses start children (`_converge`) and say what they
    are (`kind`)."""

    kind = "child"  # what a replica runs, for logs and errors: "ETL", "link"

    def __init__(
        self,
        lake: Lake,
        group: str,
        tables: list[str],
        ttl_s: float,
        *,
        stop: threading.Event | None = None,
        ready_file: Path | None = None,
    ) -> None:
        self.lake = lake
        self.group = group
        self.tables = tables
        self.membership = Membership(Group(lake, group, check_ttl(ttl_s)), tables)
        self.stop = stop or threading.Event()
        self.ready_file = ready_file
        self.children: dict[frozenset[int], Child] = {}
        self.failures: dict[int, int] = {}  # consecutive failed children, by partition
        self.retry_at: dict[int, float] = {}  # monotonic time a partition may restart
        self.unwanted: set[str] = set()
        self.fatal: DeltabusError | None = None
        self.report = SupervisorReport(group, self.membership.member, len(tables))

    # -- what subclasses give ---------------------------------------------------------------

    def _converge(self) -> None:
        """Bring the children in line with the held partitions."""
        raise NotImplementedError

    def _joined(self) -> str:
        """The log line of a replica joining its group."""
        return (
            f"{self.kind} replica {self.membership.member} joins group {self.group} "
            f"({len(self.tables)} partitions, lease {self.membership.group.ttl_ms / 1000:g}s)"
        )

    def _ready_record(self) -> dict:
        """What the ready file holds."""
        return {"pid": os.getpid(), "member": self.membership.member, "group": self.group}

    def _winding_down(self) -> None:
        """Called before the children are told to stop."""

    def _closed(self) -> None:
        """Called last, after the children stopped or the loop itself failed."""

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> SupervisorReport:
        """Hold partitions and run their children until `stop`, SIGTERM or SIGINT; then
        stop the children, release every lease and leave the group.

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
        log.info("%s", self._joined())
        try:
            self._loop()
            self._wind_down()
        finally:
            for child in self.children.values():  # only after a failure of the loop itself
                kill(child.proc)
            self._closed()
            for s, handler in previous.items():
                signal.signal(s, handler)
        self.report.elapsed_s = round(time.monotonic() - started, 3)
        if self.fatal is not None:
            raise self.fatal
        return self.report

    def _request_stop(self, signum: int, _frame: object) -> None:
        log.info("signal %d: stopping the children and leaving group %s", signum, self.group)
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
        self._winding_down()
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
        log.info("%s replica %s left group %s", self.kind, self.membership.member, self.group)

    def _step(self) -> None:
        try:
            changes = self.membership.step(take=not self.stop.is_set())
        except Exception as exc:  # noqa: BLE001 - an outage: leases lapse by the clock
            log.warning("group %s: step failed (%s); retrying", self.group, exc)
            return
        self.report.takes += len(changes.taken)
        self.report.held_most = max(self.report.held_most, len(self.membership.held))
        self.unwanted = set(changes.unwanted)
        self._lost(changes.lost)

    def _drop_lapsed(self) -> None:
        now_ms = self.membership.group.now_ms()
        lapsed = [t for t, lease in self.membership.held.items() if lease.expires_ms <= now_ms]
        for table in lapsed:
            log.warning(
                "group %s: the lease on %s ended before a renewal landed", self.group, table
            )
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

    def _active(self) -> set[int]:
        """The held partitions not dealt to another member."""
        return {self._index(t) for t in self.membership.held if t not in self.unwanted}

    def _may_start(self, partition: int) -> bool:
        """Whether `partition`'s backoff after a failed child is over."""
        return time.monotonic() >= self.retry_at.get(partition, 0.0)

    def _release_unwanted(self, running: set[int]) -> None:
        """Release the leases dealt to another member that no child in `running` runs."""
        for table in sorted(self.unwanted & set(self.membership.held)):
            if self._index(table) not in running:
                self.membership.release(table)
                self.report.releases += 1

    def _renew(self, partitions: set[int]) -> bool:
        """Renew the leases of `partitions` before a child claims their tables: a child
        never starts on a lease another member may have taken meanwhile."""
        tables = [self.tables[i] for i in sorted(partitions)]
        renewed = [self.membership.renew(t) for t in tables if t in self.membership.held]
        if len(renewed) != len(tables) or not all(renewed):
            self._lost([t for t in tables if t not in self.membership.held])
            return False
        return True

    def _add_child(self, child: Child, how: str = "") -> None:
        self.children[child.partitions] = child
        self.report.child_starts += 1
        log.info("%s started%s", child.label, f" as {how}" if how else "")

    def _terminate(self, child: Child) -> None:
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

    def _failed(self, child: Child, status: int) -> None:
        """A child exited by itself: restart it after a backoff, unless no restart can fix
        what stopped it."""
        self.report.child_failures += 1
        if status == FATAL_STATUS and not self._fenced(child):
            self.fatal = DeltabusError(
                f"the {child.label} stopped with status {status} on an error no restart "
                f"fixes (its message is above); this {self.kind} replica stopped and left "
                f"group {self.group}, so the others take its partitions",
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

    def _fenced(self, child: Child) -> bool:
        """True when a writer that started after `child` claimed one of its tables."""
        tables = [self.tables[i] for i in sorted(child.partitions)]
        return claimed_since(self.lake, tables, child.proc.pid, child.started_wall)

    def _mark_ready(self) -> None:
        """Report ready (health endpoint) once the replica has joined, and write the ready
        file (`_ready_record`)."""
        health.mark_ready()
        if self.ready_file is None or self.ready_file.exists():
            return
        tmp = Path(f"{self.ready_file}.tmp")
        tmp.write_text(json.dumps(self._ready_record()))
        tmp.replace(self.ready_file)
