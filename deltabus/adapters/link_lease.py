"""`deltabus link --lease NAME --target STREAM -- COMMAND...`: replicas of a Pathway link
program that share its partitions by leases in the lake.

Pathway runs one dataflow per `pw.run`, whose inputs are fixed when it starts, so a
replica (a supervisor that loads no Pathway) holds partitions and runs the program
as a child for the set it holds: `LINK_ENV` names the link and `PARTITIONS_ENV` lists
the partitions (`Link` reads them), and the child is restarted whenever the set changes.
The replicas are the members of the group `link.<name>` (deltabus.bus.groups.Membership).

- A partition dealt to another replica: the child is stopped (SIGTERM, SIGKILL after
  `STOP_TIMEOUT_S`), the lease released, and the child started again with the rest.
- A partition taken: the child is stopped and started again with the larger set.
- A lease lost (a renewal refused, or the lease ended before one landed): the child is
  killed at once. Whoever takes the partition claims its target table, which fences any
  program still running (deltabus.bus.fence), so every move is exactly once.
- A child that exits on its own while its leases are held is restarted after a backoff,
  unless it exited with status 2 without being fenced: an error no restart fixes, which
  stops the replica with status 2.
- SIGTERM / SIGINT: the child stops, the leases are released and the member leaves.
  The child gets SIGTERM when its replica dies (Linux parent-death signal).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
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
from deltabus.bus.groups import DEFAULT_TTL_S, Group, Membership, check_group
from deltabus.core import health
from deltabus.core.errors import ConfigError, DeltabusError
from deltabus.core.processes import child_env
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

LINK_ENV = "DELTABUS_LINK"  # as deltabus.connectors.pathway.link, which loads Pathway
PARTITIONS_ENV = "DELTABUS_LINK_PARTITIONS"
MIN_TTL_S, MAX_TTL_S = 1.0, 600.0
LOOP_S = 0.1  # how often the child is checked


@dataclass
class _Child:
    """The link program and the partitions it runs."""

    partitions: frozenset[int]
    proc: subprocess.Popen
    started: float  # monotonic
    started_wall: float
    stopping_since: float | None = None

    @property
    def label(self) -> str:
        return f"link child pid {self.proc.pid} (partitions {sorted(self.partitions)})"


@dataclass
class LinkLeaseReport:
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


def _set_parent_death_signal() -> None:
    """In the child, before exec: SIGTERM when the replica dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


class LinkSupervisor:
    """One `deltabus link --lease` replica: a group member running the link program for
    the partitions it holds (see the module docstring)."""

    def __init__(
        self,
        lake: Lake,
        name: str,
        tables: list[str],
        command: list[str],
        *,
        ttl_s: float = DEFAULT_TTL_S,
        stop: threading.Event | None = None,
        ready_file: Path | None = None,
    ) -> None:
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ConfigError(
                f"the lease time must be {MIN_TTL_S:g}..{MAX_TTL_S:g} s, got {ttl_s:g}",
                "give --lease-ttl-s 10 (the default) or another value in that range",
            )
        if not command:
            raise ConfigError(
                "no link program to run",
                "give its command after --, e.g. deltabus link eur --target orders_eur "
                "--lease -- python my_link.py",
            )
        self.lake = lake
        self.name = name
        self.tables = tables
        self.command = command
        self.group = check_group(f"link.{name}")
        self.membership = Membership(Group(lake, self.group, ttl_s), tables)
        self.stop = stop or threading.Event()
        self.ready_file = ready_file
        self.child: _Child | None = None
        self.unwanted: set[str] = set()
        self.failures = 0
        self.retry_at = 0.0  # monotonic time the child may start again
        self.fatal: DeltabusError | None = None
        self.report = LinkLeaseReport(self.group, self.membership.member, len(tables))

    def run(self) -> LinkLeaseReport:
        """Hold partitions and run the program for them until `stop`, SIGTERM or SIGINT;
        then stop the child, release every lease and leave the group.

        Raises:
            DeltabusError: the child failed with an error no restart fixes (its own
                message is in the log above).
        """
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {
                s: signal.signal(s, self._request_stop) for s in (signal.SIGTERM, signal.SIGINT)
            }
        started = time.monotonic()
        log.info(
            "link replica %s joins group %s (%d partitions, lease %gs)",
            self.membership.member,
            self.group,
            len(self.tables),
            self.membership.group.ttl_ms / 1000,
        )
        try:
            self._loop()
            self._wind_down()
        finally:
            if self.child is not None:  # only after a failure of the loop itself
                kill(self.child.proc)
            for s, handler in previous.items():
                signal.signal(s, handler)
        self.report.elapsed_s = round(time.monotonic() - started, 3)
        if self.fatal is not None:
            raise self.fatal
        return self.report

    def _request_stop(self, signum: int, _frame: object) -> None:
        log.info("signal %d: stopping the link child and leaving group %s", signum, self.group)
        self.stop.set()

    def _loop(self) -> None:
        # Heartbeat first and deal one step later: replicas started together see each
        # other before taking, and move no partition twice.
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
        """Stop the child, keep the leases renewed meanwhile, then leave the group."""
        if self.child is not None:
            self._terminate(self.child)
        next_step = 0.0
        while self.child is not None:
            if time.monotonic() >= next_step:
                self._step()
                next_step = time.monotonic() + self.membership.tick_s
            self._reap()
            time.sleep(LOOP_S)
        self.report.releases += len(self.membership.held)
        self.membership.leave()
        log.info("link replica %s left group %s", self.membership.member, self.group)

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
        """Kill the child at once when it runs a partition whose lease is gone."""
        if not tables:
            return
        self.report.lost += len(tables)
        gone = {self.tables.index(t) for t in tables}
        child = self.child
        if child is not None and child.partitions & gone:
            log.warning("%s: lease lost, killing it", child.label)
            kill(child.proc)
            child.stopping_since = child.stopping_since or time.monotonic()

    def _active(self) -> frozenset[int]:
        return frozenset(
            self.tables.index(t) for t in self.membership.held if t not in self.unwanted
        )

    def _converge(self) -> None:
        """Bring the child in line with the held partitions: one child for the whole set,
        restarted whenever the set changes."""
        active = self._active()
        child = self.child
        if child is not None:
            if child.partitions != active:
                self._terminate(child)
            return
        for table in sorted(self.unwanted & set(self.membership.held)):
            self.membership.release(table)
            self.report.releases += 1
        if active and time.monotonic() >= self.retry_at and self._renew(active):
            self._start(active)

    def _renew(self, partitions: frozenset[int]) -> bool:
        """Renew the leases of `partitions` before the child claims their tables: a child
        never starts on a lease another member may have taken meanwhile."""
        tables = [self.tables[i] for i in sorted(partitions)]
        renewed = [self.membership.renew(t) for t in tables if t in self.membership.held]
        if len(renewed) != len(tables) or not all(renewed):
            self._lost([t for t in tables if t not in self.membership.held])
            return False
        return True

    def _start(self, partitions: frozenset[int]) -> None:
        listed = ",".join(str(i) for i in sorted(partitions))
        env = child_env(self.lake.settings, {LINK_ENV: self.name, PARTITIONS_ENV: listed})
        # stdout too goes to stderr: this replica's stdout carries its own report only.
        proc = subprocess.Popen(
            self.command,
            env=env,
            stdout=sys.stderr.fileno(),
            stdin=subprocess.DEVNULL,
            preexec_fn=_set_parent_death_signal,  # noqa: PLW1509 - no threads fork here
        )
        self.child = _Child(partitions, proc, time.monotonic(), time.time())
        self.report.child_starts += 1
        log.info("%s started", self.child.label)

    def _terminate(self, child: _Child) -> None:
        if child.stopping_since is None:
            child.stopping_since = time.monotonic()
            log.info("stopping %s", child.label)
            try:
                child.proc.terminate()
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        child = self.child
        if child is None:
            return
        status = child.proc.poll()
        if status is None:
            stopping = child.stopping_since
            if stopping is not None and time.monotonic() - stopping > STOP_TIMEOUT_S:
                log.warning("%s did not stop in %.0fs; killing it", child.label, STOP_TIMEOUT_S)
                kill(child.proc)
            return
        self.child = None
        if child.stopping_since is not None or self.stop.is_set():
            log.info("%s stopped (status %d)", child.label, status)
            return
        self._failed(child, status)

    def _failed(self, child: _Child, status: int) -> None:
        """The child exited by itself: restart it after a backoff, unless no restart can
        fix what stopped it."""
        self.report.child_failures += 1
        if status == FATAL_STATUS and not self._fenced(child):
            self.fatal = DeltabusError(
                f"the {child.label} stopped with status {status} on an error no restart "
                f"fixes (its message is above); this link replica stopped and left group "
                f"{self.group}, so the others take its partitions",
                "fix what the program's message says, then start this replica again",
            )
            log.error("%s", self.fatal.problem)
            self.stop.set()
            return
        ran = time.monotonic() - child.started
        self.failures = 1 if ran >= STEADY_S else self.failures + 1
        delay = BACKOFF_S[min(self.failures, len(BACKOFF_S)) - 1]
        self.retry_at = time.monotonic() + delay
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
        file: its pid, member id and group."""
        health.mark_ready()
        if self.ready_file is None or self.ready_file.exists():
            return
        tmp = Path(f"{self.ready_file}.tmp")
        record = {"pid": os.getpid(), "member": self.membership.member, "group": self.group}
        tmp.write_text(json.dumps(record))
        tmp.replace(self.ready_file)


def lease_link(
    lake: Lake,
    name: str,
    target: str,
    command: list[str],
    ttl_s: float = DEFAULT_TTL_S,
    ready_file: Path | None = None,
) -> dict:
    """Run one `--lease` replica of link `name` writing stream `target`, whose program is
    `command`, until SIGTERM / SIGINT. Returns its report.

    Raises:
        ConfigError: `target` is not a declared stream, or an option is invalid.
    """
    from deltabus.bus.streams import get_stream

    stream = get_stream(lake, target)
    return (
        LinkSupervisor(lake, name, stream.tables, command, ttl_s=ttl_s, ready_file=ready_file)
        .run()
        .as_dict()
    )
