"""Commits for the ETL's Pathway inputs: one right after rows were sent, none otherwise.

Pathway's own autocommit (`autocommit_duration_ms`) advances every input's time on a
fixed timer whether or not anything was read: with 10 ms ticks an idle ETL wakes its
engine 100 times a second per input and spends about 3 % of a core doing nothing, and a
busy one pays for 100 times a second of engine progress when rows come 20 times a second
(one Delta version per input per commit interval). The ticker commits when a subject
says it has sent rows, so each batch of rows gets its own Pathway time at once, and an
idle ETL sleeps.

A Pathway input's rows are stamped with the time its last commit opened, not the time
they were sent: a subject therefore also commits itself right before it sends
(deltabus.etl.source), or `time` would lag the rows by the gap since the previous batch.
Pathway's times step by 2 ms, and a commit within the same step as the one before the
rows does not close their time: they would wait for the next batch's commit. So the
ticker commits `PATHWAY_TIME_STEP_S` after it is woken.

All inputs are committed together, not only the one that sent rows: an output that
depends on two inputs releases time T only once both have passed T, so a quiet input that
never commits would hold back the rows of the busy one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pathway as pw

# Pathway's times are even milliseconds; a little more, so the commit lands a step later.
PATHWAY_TIME_STEP_S = 0.0025


class CommitTicker:
    """Commits every one of `subjects` after any of them sent rows (sends that come while
    a commit runs share the next one)."""

    def __init__(self, subjects: Sequence[pw.io.python.ConnectorSubject]) -> None:
        self.subjects = list(subjects)
        self._closed = threading.Event()
        self.ticks = 0
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="commit-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def rows_sent(self) -> None:
        """Called by a subject right after it sent rows (so the commit follows them)."""
        self._wake.set()

    def close(self) -> None:
        """Stop committing (the dataflow has finished)."""
        self._closed.set()
        self._wake.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed.is_set():
                return
            # Rows sent meanwhile wake the loop again: their commit comes a step later too.
            if self._closed.wait(PATHWAY_TIME_STEP_S):
                return
            for subject in self.subjects:
                subject.commit()
            self.ticks += 1
