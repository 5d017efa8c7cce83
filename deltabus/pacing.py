"""When a tail looks for the next commit: as it lands where the store says so, else paced.

Polling a log every 20 ms costs a GET per table per poll, about 50 a second of which
all but the few that find a commit are misses. A `Pacer` spends requests where commits
are:

- where the store streams commit notifications (deltabus.notify), the tail waits on them
  and reads exactly up to the version notified; a slow safety poll covers a missed event;
- otherwise it polls in step with the writer: after finding a commit it sleeps for most of
  the writer's measured gap between commits, then polls every `poll_interval` until the
  next one lands, so a tail that keeps up misses about once per commit, not four times;
- a table that has gone quiet is polled less and less often, up to `idle_poll` (the
  settings' `DELTABUS_IDLE_POLL_MS`), which bounds both the idle cost and how late the
  first commit after a pause is seen.
"""

from __future__ import annotations

import threading
import time

from deltabus.lake import Lake
from deltabus.notify import notifier_for

# With notifications, a tail still polls this often in case an event was missed.
SAFETY_POLL_S = 10.0
# Sleep at most this long at a time, so a stop request is never kept waiting.
WAIT_SLICE_S = 0.25
# The writer's gap is an average over about this many commits.
GAP_WEIGHT = 0.2
# Polls start this much of the gap early: commit times jitter.
EARLY = 0.25


class Pacer:
    """Paces one tail's polls of one table (see the module docstring)."""

    def __init__(self, lake: Lake, table: str, poll_interval: float, stop: threading.Event) -> None:
        self.poll_interval = poll_interval
        self.idle_poll = max(poll_interval, lake.settings.idle_poll_ms / 1000)
        self.stop = stop
        self.notifier = notifier_for(lake)
        self.watch = self.notifier.watch(table) if self.notifier is not None else None
        self.gap: float | None = None  # the writer's mean seconds between commits
        self._last_hit: float | None = None
        self._idle = True  # backing off: the time to the next hit says nothing of the gap
        self._delay = poll_interval
        # When the next poll is due, counted from the poll that set it (not from when the
        # tail is done with what it found: that would let the polls drift behind).
        self._due = time.monotonic()

    @property
    def notified(self) -> bool:
        """True while commit notifications are flowing (the store streams them)."""
        return self.notifier is not None and self.notifier.healthy

    def latest_notified(self) -> int | None:
        """The highest version notified, while notifications flow; None otherwise."""
        return self.watch.latest if self.watch is not None and self.notified else None

    def found(self, versions: int) -> None:
        """A poll found `versions` new commits (0: a miss)."""
        now = time.monotonic()
        if versions == 0:
            quiet = now - self._last_hit if self._last_hit is not None else None
            # A miss long after the expected commit means the writer paused: back off.
            if quiet is None or quiet > 2 * (self.gap or self.poll_interval) + self.poll_interval:
                self._idle = True
                self._delay = min(self.idle_poll, max(self.poll_interval, self._delay * 1.5))
            else:
                self._delay = self.poll_interval
            self._due = now + self._delay
            return
        if self._last_hit is not None and not self._idle:
            gap = (now - self._last_hit) / versions
            self.gap = gap if self.gap is None else self.gap + GAP_WEIGHT * (gap - self.gap)
        self._last_hit, self._idle = now, False
        # Next look: most of a gap from now, when the writer's next commit is due.
        ahead = (self.gap or 0.0) * (1 - EARLY)
        self._delay = min(self.idle_poll, max(self.poll_interval, ahead))
        self._due = now + self._delay

    def wait(self) -> None:
        """Sleep until the next poll is due, a notification arrives or stop is set."""
        if self.watch is not None and self.notified:
            deadline = time.monotonic() + SAFETY_POLL_S
            while not self.stop.is_set() and self.notified:
                left = deadline - time.monotonic()
                if left <= 0 or self.watch.wait(min(WAIT_SLICE_S, left)):
                    return
            return
        deadline = self._due
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.stop.wait(min(WAIT_SLICE_S, left))
