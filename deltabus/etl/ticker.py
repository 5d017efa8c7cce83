"""Commit ticks for the ETL's Pathway inputs: every few milliseconds while rows flow,
none while the inputs are idle.

Pathway's own autocommit (`autocommit_duration_ms`) advances every input's time on a
fixed timer whether or not anything was read: with 10 ms ticks an idle ETL wakes its
engine 100 times a second per input and spends about 3 % of a core doing nothing. The
ticker gives the same ticks under load (all inputs committed together, every `interval`)
and stops them `linger` seconds after the last rows were sent, so an idle ETL sleeps.

All inputs are committed on every tick, not only the one that sent rows: an output that
depends on two inputs releases time T only once both have passed T, so a quiet input that
never commits would hold back the rows of the busy one.

A Pathway input stamps rows with the time its last commit opened, not the time they are
sent, so a subject also commits itself right before it sends (deltabus.etl.source):
otherwise `time` would lag the rows by up to a tick. Ticks keep coming while rows flow
rather than one or two per batch: tried that way, the output of a large batch (50,000
rows per input at 1000 ms) waited for the next batch, and the last one for the ETL's stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pathway as pw

DEFAULT_LINGER_S = 1.0


class CommitTicker:
    """Commits `subjects` every `interval` s from the first rows sent until `linger` s
    after the last."""

    def __init__(
        self,
        subjects: Sequence[pw.io.python.ConnectorSubject],
        interval: float,
        linger: float = DEFAULT_LINGER_S,
    ) -> None:
        self.subjects = list(subjects)
        self.interval = interval
        self.linger = linger
        self._closed = threading.Event()
        self.ticks = 0
        self._active_until = 0.0
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="commit-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def rows_sent(self) -> None:
        """Called by a subject right after it sent rows (so the commit follows them)."""
        self._active_until = time.monotonic() + self.linger
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
            next_tick = time.monotonic()
            while not self._closed.is_set() and time.monotonic() < self._active_until:
                for subject in self.subjects:
                    subject.commit()
                self.ticks += 1
                next_tick += self.interval
                delay = next_tick - time.monotonic()
                if delay > 0:
                    self._closed.wait(delay)
                else:  # fell behind (a long GIL hold): tick from now on
                    next_tick = time.monotonic()
