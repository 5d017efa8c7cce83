"""When a tail looks for the next commit: as it lands where the store says so, else paced.

Polling a log every 20 ms costs a GET per table per poll, about 50 a second of which
all but the few that find a commit are misses. A `Pacer` spends requests where commits
are:

- where the store streams commit notifications (deltabus.notify), the tail waits on them
  and reads exactly up to the version notified; a slow safety poll covers a missed event;
- otherwise it polls in step with the writer. Each commit carries its writer's timestamp,
  so the tail knows the writer's gap between commits (from the writer's clock, not from
  when its own polls happened to find them) and when the next commit is due to land: its
  first poll for a commit aims there; after a miss it polls every `poll_interval`,
  further apart the longer the commit is late (up to a twentieth of the gap). The aim
  learns from its outcome: a first poll that misses moves it later, one that finds the
  commit earlier, each twice as far after each such outcome in a row (the aim may be
  off by any amount), unless the poll itself went out late. It settles where about one
  first poll in four misses, whatever the clock skew between writer and tail or the time
  a commit takes to land, so a tail that keeps up costs about 1.3 GETs per commit
  (pacing by its own hits: 2.2). The gap comes from the writer's timestamps however the
  commits were found, except across a pause; two gaps in a row under half the average
  replace it (the average spanned the writer's start, a table created seconds before its
  first rows), and the aim is taken again.
  Without timestamps it sleeps most of the gap measured between its own hits;
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
# Gaps under this part of the average, twice in a row, replace it: the average spanned
# the writer's start or a pause, not its pace.
SHORT_GAP = 0.5
# Without writer timestamps, polls start this much of the gap early: commit times jitter.
EARLY = 0.25
# With them, a first poll that misses aims the next AIM_UP_S later, one that finds its
# commit AIM_DOWN_S earlier; each twice as far after two such outcomes in a row, and so on.
AIM_DOWN_S = 0.001
AIM_UP_S = 0.008
# After a miss the next polls come every poll interval, this much further apart each
# time, up to this part of the gap.
MISS_POLL_GROWTH = 1.5
MISS_POLL_CAP = 0.05


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
        self._last_look: float | None = None  # when the last poll went out (monotonic)
        self._last_commit_ms: float | None = None  # the writer's timestamp of the last commit
        self._short = 0  # gaps in a row under SHORT_GAP of the average
        # Seconds after a commit's due time (its writer's timestamp + gap) at which the
        # first poll for it goes out; it absorbs clock skew and the time to land.
        self.aim: float | None = None
        self._aimed = False  # the pending poll was aimed at a predicted commit
        self._step = AIM_DOWN_S  # how much earlier the next hit at first look moves the aim
        self._up = AIM_UP_S  # how much later the next miss at first look moves it
        self._settled = False  # a first look has missed since the aim was first taken
        self._missed = False  # a poll missed since the last hit
        self._late = False  # the pending poll goes out late: the tail was busy
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

    def found(self, versions: int, commit_ms: float | None = None) -> None:
        """A poll found `versions` new commits (0: a miss); `commit_ms` is the writer's
        timestamp (ms since the epoch) of the newest one, when its commit info has one."""
        now = time.monotonic()
        # The newest commit found landed between the look before this one and this one.
        since = now - self._last_look if self._last_look is not None else self.poll_interval
        self._last_look = now
        if versions == 0:
            repeat = self._missed and not self._idle  # missed this commit before
            self._missed = True
            quiet = now - self._last_hit if self._last_hit is not None else None
            # A miss long after the expected commit means the writer paused: back off.
            if quiet is None or quiet > 2 * (self.gap or self.poll_interval) + self.poll_interval:
                self._idle, self._aimed = True, False
                self._delay = min(self.idle_poll, max(self.poll_interval, self._delay * 1.5))
            else:
                # Polls after a miss: every poll interval, further apart the longer the
                # commit is late, up to a twentieth of the gap (at 1000 ms commits a commit
                # late by 300 ms cost 15 polls; at 100 ms this stays the poll interval).
                cap = max(self.poll_interval, MISS_POLL_CAP * (self.gap or 0.0))
                grown = self._delay * MISS_POLL_GROWTH if repeat else self.poll_interval
                self._delay = min(cap, max(self.poll_interval, grown))
            self._due = now + self._delay
            return
        if commit_ms:
            self._found_stamped(versions, commit_ms, since)
        else:
            self._found_unstamped(now, versions)
        self._last_hit, self._idle, self._missed = now, False, False
        self._due = now + self._delay

    def next_landed(self, commit_ms: float) -> bool:
        """Whether the commit after the one stamped `commit_ms` should have landed by now.

        A tail that found a commit reads on only then: a tail that keeps up would
        otherwise end every read with a GET that finds nothing. Unknown (no timestamps,
        no gap measured yet): True, read on.
        """
        if not commit_ms or self.gap is None or self.aim is None:
            return True
        return time.time() >= commit_ms / 1000 + self.gap + self.aim

    def _update_gap(self, gap: float, versions: int = 1) -> bool:
        """Average `gap` (seconds per commit over `versions` commits) into the writer's gap;
        True when it replaced the average instead.

        The first gap a tail measures often spans the writer's start: a partition table
        created seconds before its first rows, then committing every 0.4 s. Averaged
        down, 1.7 s took 25-40 commits to approach 0.4 s, and all the while the tail
        looked too late, found every commit at the first look, and moved its aim ever
        earlier, so it then missed 2-3 polls a commit for as long again (a pacing
        simulation; 47-65 polls a second that found nothing at 4 partitions and 100 ms)."""
        if gap <= 0:
            return False
        if self.gap is None:
            self.gap = gap
            return False
        self._short = self._short + versions if gap < SHORT_GAP * self.gap else 0
        if self._short >= 2:
            self.gap, self._short = gap, 0
            return True
        self.gap += GAP_WEIGHT * (gap - self.gap)
        return False

    def _found_unstamped(self, now: float, versions: int) -> None:
        """Pace by when our own polls found commits: most of a gap from now."""
        if self._last_hit is not None and not self._idle:
            self._update_gap((now - self._last_hit) / versions, versions)
        ahead = (self.gap or 0.0) * (1 - EARLY)
        self._delay = min(self.idle_poll, max(self.poll_interval, ahead))
        self._aimed, self._last_commit_ms = False, None

    def _found_stamped(self, versions: int, commit_ms: float, since: float) -> None:
        """Aim the next poll at when the writer's next commit should land (module doc)."""
        wall = time.time()
        if self._last_commit_ms is not None:
            # The writer's own clock gives the gap, however our polls found the commits;
            # only a gap measured across a pause (we had backed off) is not taken as the
            # writer's pace. Taking none while backed off never learnt a gap above three
            # poll intervals (1000 ms commits): every commit then cost ten misses.
            gap = (commit_ms - self._last_commit_ms) / 1000 / versions
            if not self._idle or self.gap is None or gap <= 2 * self.gap:
                if self._update_gap(gap, versions):
                    self.aim = None  # learnt against the wrong gap: taken again below
        self._last_commit_ms = commit_ms
        if self.gap is None:  # one commit seen: nothing to aim at yet
            self._delay, self._aimed = self.poll_interval, False
            return
        if self.aim is None:
            self._step, self._settled = AIM_DOWN_S, False
            # First aim: when we saw this one, less half the time since the look before
            # (it landed in between), and at most half a gap: it is the newest commit of
            # a writer committing every gap. A tail that backed off or slept through
            # several commits would otherwise take its own lateness, up to half a second
            # at 1000 ms, for the landing, and read the next ten commits that late.
            self.aim = wall - commit_ms / 1000 - min(since, self.gap) / 2
        elif self._aimed and versions == 1 and self._missed:
            # The first look missed: later by AIM_UP_S, twice as far after each such miss
            # in a row, by at most a tenth of the gap. One late commit moves the aim
            # little; an aim 0.9 s too early (start-up) is back in about a dozen commits
            # at 1000 ms, where by AIM_UP_S each time it took over a hundred.
            self.aim += self._up
            self._up = min(2 * self._up, max(AIM_UP_S, self.gap / 10))
            self._step, self._settled = AIM_DOWN_S, True
        elif self._aimed and versions == 1 and not self._late:
            # Found at the first look: we may be late by any amount (the first aim was
            # taken while catching up, say), so each hit in a row moves twice as far,
            # by at most a twentieth of the gap once a first look has missed. A look
            # that went out late (the tail was busy with the rows before) says nothing.
            self._up = AIM_UP_S
            self.aim -= self._step
            self._step = min(2 * self._step, self.gap / (20 if self._settled else 2))
        due = commit_ms / 1000 + self.gap + self.aim  # the next commit's first poll
        self._delay = min(self.idle_poll, max(0.0, due - wall))
        self._aimed = True

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
        self._late = time.monotonic() - deadline > self.poll_interval / 2
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.stop.wait(min(WAIT_SLICE_S, left))
