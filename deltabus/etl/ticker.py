"""Commit ticks for the ETL's Pathway inputs: only while rows are in flight, and only for
the inputs of the outputs those rows go to.

Pathway's own autocommit (`autocommit_duration_ms`) advances every input's time on a
fixed timer whether or not anything was read: with 10 ms ticks an idle ETL wakes its
engine 100 times a second per input. Even ticking only "while rows flow" costs: on the
Intel Xeon, committing 2 inputs every 10 ms took 0.023 cores of an otherwise idle
process, and 4 inputs 0.039. An ETL process owning two unified partitions, each fed one
window in P by the sticky partitioner, would tick all four inputs all the time.

So the ticker works per group: the inputs that feed one output (a unified partition). A
group is ticked from the moment one of its inputs sent rows until its output has seen
them (`in_flight`), every `interval`; other groups, and idle ones, are left alone. This is
safe because Pathway releases a time at an output once every input *that output depends
on* has passed it: an uncommitted input of another partition holds nothing back.

A Pathway input stamps rows with the time its last commit opened, so a subject commits
itself right before it sends (deltabus.etl.source). Pathway's times are 2 ms apart: a
commit within the same 2 ms as that one opens no new time and releases nothing (tried:
an output then waited for the next batch). The first tick therefore comes `FIRST_TICK_S`
after the rows are sent, and ticks go on until the output has seen them, however long
the engine takes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pathway as pw

# Pathway's times are even milliseconds: a commit this long after the one that stamped
# the rows is the first that can release them.
FIRST_TICK_S = 0.003


@dataclass
class TickGroup:
    """The inputs of one output, and whether rows sent to them have not reached it."""

    subjects: Sequence[pw.io.python.ConnectorSubject]
    in_flight: Callable[[], bool]


class CommitTicker:
    """Commits each group's inputs every `interval` s while that group has rows in
    flight."""

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
