"""Commit ticks for the ETL's Pathway inputs, replacing Pathway's autocommit.

A `CommitTicker` commits the inputs of each `TickGroup` (the inputs that feed one
output, a unified partition) every `interval` seconds from `FIRST_TICK_S` after a
subject reports sent rows until the group's output has seen them (`in_flight` is
false), and leaves every other group alone; it never ticks while nothing is in flight.
Sources also commit right before they send (deltabus.apps.timezones.etl.source), so rows are stamped
with the time they are sent.

Pathway releases an output's time once every input that output depends on has passed
it, so committing only the group in flight is enough; an idle ETL then never wakes its
engine (docs/adr/0014-commit-ticks.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pathway as pw

# Pathway's times are 2 ms apart: a commit this long after the send can release the rows.
FIRST_TICK_S = 0.003


@dataclass
class TickGroup:
    """The inputs of one output, and whether rows sent to them have not reached it."""

    subjects: Sequence[pw.io.python.ConnectorSubject]
    in_flight: Callable[[], bool]


class CommitTicker:
    """Commits each group's inputs every `interval` s while that group has rows in
    flight, on a daemon thread started by `start` and ended by `close`.

    Args:
        groups: the groups to tick, each its inputs and whether rows are in flight.
        interval: seconds between ticks of a group in flight.
    """

    def __init__(self, groups: Sequence[TickGroup], interval: float) -> None:
        self.groups = list(groups)
        self.interval = interval
        self._closed = threading.Event()
        self.ticks = 0  # input commits made (each group's inputs count once per tick)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="commit-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def rows_sent(self) -> None:
        """Called by a subject right after it sent rows (so the commit follows them)."""
        self._wake.set()

    def close(self) -> None:
        """Stop ticking (the dataflow has finished)."""
        self._closed.set()
        self._wake.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait()
            self._wake.clear()
            next_tick = time.monotonic() + FIRST_TICK_S
            while not self._closed.is_set():
                delay = next_tick - time.monotonic()
                if delay > 0:
                    self._closed.wait(delay)
                else:  # fell behind (a long GIL hold): tick from now on
                    next_tick = time.monotonic()
                active = [g for g in self.groups if g.in_flight()]
                if not active:
                    break  # all delivered: sleep until the next rows (the wake is kept)
                for group in active:
                    for subject in group.subjects:
                        subject.commit()
                    self.ticks += 1
                next_tick += self.interval
