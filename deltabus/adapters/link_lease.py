"""`deltabus link --lease NAME --target STREAM -- COMMAND...`: replicas of a Pathway link
program that share its partitions by leases in the lake.

Pathway runs one dataflow per `pw.run`, whose inputs are fixed when it starts, so a
replica (a supervisor that loads no Pathway) holds partitions and runs the program
as one child for the set it holds: `LINK_ENV` names the link and `PARTITIONS_ENV` lists
the partitions (`Link` reads them), and the child is restarted whenever the set changes.
The replicas are the members of the group `link.<name>`; moves, lost leases, failed
children and stops are handled as deltabus.adapters.lease_supervisor says. The child
gets SIGTERM when its replica dies (Linux parent-death signal).
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from deltabus.adapters.lease_supervisor import Child, LeaseSupervisor
from deltabus.bus.groups import DEFAULT_TTL_S, check_group
from deltabus.core.errors import ConfigError
from deltabus.core.processes import child_env
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

LINK_ENV = "DELTABUS_LINK"  # as deltabus.connectors.pathway.link, which loads Pathway
PARTITIONS_ENV = "DELTABUS_LINK_PARTITIONS"


def _set_parent_death_signal() -> None:
    """In the child, before exec: SIGTERM when the replica dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


class LinkSupervisor(LeaseSupervisor):
    """One `deltabus link --lease` replica: a group member running the link program for
    the partitions it holds (see the module docstring)."""

    kind = "link"

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
        if not command:
            raise ConfigError(
                "no link program to run",
                "give its command after --, e.g. deltabus link eur --target orders_eur "
                "--lease -- python my_link.py",
            )
        super().__init__(
            lake, check_group(f"link.{name}"), tables, ttl_s, stop=stop, ready_file=ready_file
        )
        self.name = name
        self.command = command

    def _converge(self) -> None:
        """One child for the whole held set, restarted whenever the set changes."""
        active = self._active()
        if self.children:
            for child in self.children.values():
                if child.partitions != active:
                    self._terminate(child)
            return
        self._release_unwanted(set())
        if active and all(self._may_start(i) for i in active) and self._renew(active):
            self._start(frozenset(active))

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
        self._add_child(Child("link child", partitions, proc, time.monotonic(), time.time()))


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
