"""When a tail looks for a table's next commit.

A `Pacer` tells one tail of one table when to poll. While the store streams commit
notifications (deltabus.bus.notify) the tail waits on them, reads exactly up to the version
notified and polls every `SAFETY_POLL_S` in case an event was lost. Otherwise the first
poll for the next commit goes out at the last commit's writer timestamp + the writer's
gap + a learnt aim; after a miss the tail polls every `poll_interval`, further apart the
later the commit; a quiet table is polled less and less often, up to `idle_poll`
(`DELTABUS_IDLE_POLL_MS`). Tables without writer timestamps are paced by the tail's own
hits.

Aiming at the writer's clock, rather than polling on a fixed interval, spends about one
GET per commit where a fixed interval spends dozens of misses; the rules and their
measurements are in docs/adr/0012-pacer-rules.md.
"""

from __future__ import annotations

import threading
import time

from deltabus.bus.notify import notifier_for
from deltabus.bus.tail import READ_AHEAD_MAX, Commit, DeltaLogTail
from deltabus.core.errors import DeltabusError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake

# With notifications flowing, seconds between safety polls.
SAFETY_POLL_S = 10.0
# Longest single sleep, so a stop request is never kept waiting.
WAIT_SLICE_S = 0.25
# Weight of a new gap in the writer's moving-average gap.
GAP_WEIGHT = 0.2
# Two gaps in a row under this share of the average replace it.
SHORT_GAP = 0.5
# Without writer timestamps, polls start this share of the gap early.
EARLY = 0.25
# First steps of the aim: earlier after a hit, later after a miss (doubling in a row).
AIM_DOWN_S = 0.001
AIM_UP_S = 0.008
# After a miss: each poll this much further apart, up to this share of the gap.
MISS_POLL_GROWTH = 1.5
MISS_POLL_CAP = 0.05


class Pacer:
    """Paces one tail's polls of one table.

    Args:
        lake: the lake, for its settings (`idle_poll_ms`) and its notifier.
        table: the table tailed, whose notifications to watch.
        poll_interval: seconds between polls after a miss (and the shortest delay).
        stop: set to end `wait` early.
    """

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
        # Seconds after a commit's due time (writer timestamp + gap) of its first poll.
        self.aim: float | None = None
        self._aimed = False  # the pending poll was aimed at a predicted commit
        self._step = AIM_DOWN_S  # how much earlier the next hit at first look moves the aim
        self._up = AIM_UP_S  # how much later the next miss at first look moves it
        self._settled = False  # a first look has missed since the aim was first taken
        self._missed = False  # a poll missed since the last hit
        self._late = False  # the pending poll goes out late: the tail was busy
        self._idle = True  # backing off: the time to the next hit says nothing of the gap
        self._delay = poll_interval
        # When the next poll is due, counted from the poll that set it.
        self._due = time.monotonic()

    @property
    def notified(self) -> bool:
        """True while commit notifications are flowing (the store streams them)."""
        return self.notifier is not None and self.notifier.healthy

    def latest_notified(self) -> int | None:
        """The highest version notified, while notifications flow; None otherwise."""
        return self.watch.latest if self.watch is not None and self.notified else None

    def found(self, versions: int, commit_ms: float | None = None) -> None:
        """Record a poll's outcome and set when the next poll is due.

        Args:
            versions: new commits the poll found (0: a miss).
            commit_ms: the writer's timestamp (ms since the epoch) of the newest commit
                found, when its commit info has one.
        """
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
                # Polls after a miss: every poll interval, growing, up to MISS_POLL_CAP of
                # the gap.
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
        """Whether the commit after the one stamped `commit_ms` is due by now.

        A tail that found a commit reads on only then, so a tail that keeps up does not
        end every read with a GET that finds nothing.

        Returns:
            True when it is due, or when that cannot be known (no timestamp, no gap or
            aim yet); False otherwise.
        """
        if not commit_ms or self.gap is None or self.aim is None:
            return True
        return time.time() >= commit_ms / 1000 + self.gap + self.aim

    def _update_gap(self, gap: float, versions: int = 1) -> bool:
        """Average `gap` (seconds per commit over `versions` commits) into the writer's gap.

        Two gaps in a row under `SHORT_GAP` of the average replace it: the first gap a
        tail measures often spans the writer's start (docs/adr/0012-pacer-rules.md).

        Returns:
            True when `gap` replaced the average, False when it was averaged in or
            ignored (not positive, or the first gap).
        """
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
            # The writer's clock gives the gap however the commits were found, except a
            # gap measured across a pause (backed off, and over twice the known gap).
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
            # First aim: it landed between the look before and this one, so at the
            # middle of that time, and at most half a gap before now.
            self.aim = wall - commit_ms / 1000 - min(since, self.gap) / 2
        elif self._aimed and versions == 1 and self._missed:
            # The first look missed: later by AIM_UP_S, doubling with each such miss in a
            # row, by at most a tenth of the gap.
            self.aim += self._up
            self._up = min(2 * self._up, max(AIM_UP_S, self.gap / 10))
            self._step, self._settled = AIM_DOWN_S, True
        elif self._aimed and versions == 1 and not self._late:
            # Found at the first look: earlier by a step that doubles with each such hit
            # in a row, by at most a twentieth of the gap once a first look has missed.
            # A look that went out late (the tail was busy) moves nothing.
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


def read_landed(
    tail: DeltaLogTail, pacer: Pacer, first: int, limit: int, what: str
) -> tuple[list[Commit], DeltabusError | None]:
    """The commits that have landed from version `first` on (at most `limit`), and the
    error of a version the tail refuses (the commits before it are still returned).

    With a version notified at or past `first`, the versions up to it are read side by
    side and no GET is sent that would find nothing; a tail found behind (two versions
    landed) reads on side by side. Reading a commit starts the GETs of its data files, so
    a caller that reads every commit first and their rows after fetches them together.
    """
    commits: list[Commit] = []
    notified = pacer.latest_notified()
    upto = notified if notified is not None and notified >= first else None
    if upto is not None:  # these versions have landed: read them side by side
        tail.read_ahead(first, min(upto - first + 1, READ_AHEAD_MAX))
    while len(commits) < limit:
        version = first + len(commits)
        if upto is not None and version > upto:
            break
        try:
            commit = retry_storage(lambda v=version: tail.commit(v), what=what)
        except DeltabusError as exc:
            return commits, exc
        if commit is None:
            break
        commits.append(commit)
        if upto is None and not pacer.next_landed(commit.timestamp_ms):
            break  # the next one is not due yet: no GET that would find nothing
        if len(commits) >= 2:  # two versions had landed: behind, read on side by side
            tail.read_ahead(version + 1, READ_AHEAD_MAX)
    return commits, None
