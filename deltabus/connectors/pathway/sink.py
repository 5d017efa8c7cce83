"""A Pathway output that commits input-version batches to one Delta table, exactly once.

The Pathway table written holds one row per input version: `rows` wraps an Arrow table,
`source` names the input table and `version` its version; `to_table` turns a commit's
batches into rows of the output table. Rows are buffered per Pathway time; a committer
thread appends everything buffered about once per commit interval, so Pathway never
waits on storage. Each commit records the input positions it covers (the highest input
version per table whose rows are all in it) as app transactions in the same Delta
commit, with the sink's own sequence number as idempotency marker: output and input
positions land atomically, which is what makes restarts exactly-once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pathway as pw
import pyarrow as pa

from deltabus.bus.positions import position_marker
from deltabus.connectors.pathway.output import Output
from deltabus.core.errors import user_storage_error
from deltabus.core.retry import retry_storage
from deltabus.delta.tables import metadata

log = logging.getLogger(__name__)
_monotonic = time.monotonic  # on_time_end's `time` argument shadows the module

BURST = 2  # commits allowed back to back
# The rate limit refills this many commits per commit interval: a little more than one, so
# the commits come back in step with the arrivals after a late input
# (docs/adr/0030-sink-commit-rate-limit.md).
REFILL_PER_INTERVAL = 1.25
# An input's cadence is the shortest of its last CADENCE_GAPS gaps between deliveries
# (at least one commit interval): a late delivery makes one long gap and one short, and
# an input that keeps one interval's pace keeps a cadence of one interval under load. A
# gap of more than PAUSE_INTERVALS commit intervals is a pause, not its cadence.
CADENCE_GAPS = 8
LINGER_SHARE = 0.5
PAUSE_INTERVALS = 20
# An idle sink re-reads the table this often to notice that a newer writer fenced it (one
# log listing): a fenced program then exits even when it has nothing more to commit.
LEASE_CHECK_S = 5.0

# (rows, Pathway time, sign): one input version's batch as the sink received it.
Received = tuple[pa.Table, int, int]


@dataclass
class SinkStats:
    rows: int = 0
    commits: int = 0
    version: int = -1
    last_commit_ms: float = 0.0


class TableSink(pw.io.python.ConnectorObserver):
    """Commits the batches it receives to `output`'s table about once per
    `commit_interval` s, each commit with the input positions it covers.

    Args:
        output: the output table, opened (and claimed) by `open_output`; its positions
            and sequence are where the sink starts, recorded in app transactions
            `position_marker(app_id, table)` and `app_id`.
        commit_interval: seconds; the sink commits at most about once per interval.
        to_table: the output rows of one commit, from its batches (none when the commit
            only moves positions); raising stops the sink before the commit.
        commit_info: extra commit metadata, asked for at each commit.
        on_failure: called with the error that stopped the committer thread.
    """

    def __init__(
        self,
        output: Output,
        commit_interval: float,
        *,
        to_table: Callable[[list[Received]], pa.Table],
        commit_info: Callable[[], dict[str, object]] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        appender = output.appender
        positions = output.positions
        self.appender = appender
        self.app_id = output.app_id
        self.to_table = to_table
        self.lease = output.lease
        self.on_failure = on_failure
        self.checkpointer = output.checkpointer
        self.commit_info = commit_info
        self.commit_interval = commit_interval
        self.positions = dict(positions)  # highest input version fully delivered
        self.seq = output.next_seq
        self.stats = SinkStats(version=appender.version())
        # This Pathway time's batches: (rows, time, sign) per version batch.
        self._batches: list[Received] = []
        self._pending: list[tuple[list[Received], dict[str, int]]] = []
        self._seen: dict[str, int] = dict(positions)
        self._delivered: dict[str, int] = dict(positions)  # as of the last time end
        self._last_arrival: dict[str, float] = {}  # input -> when it last delivered rows
        # input -> its last gaps between deliveries (s): an input partition fed one
        # window in P by the sticky partitioner delivers every P intervals.
        self._gaps: dict[str, deque[float]] = {}
        self._tokens = float(BURST)  # commits the rate limit allows right now
        self._refilled = time.monotonic()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._commit_loop, name="delta-sink", daemon=True)
        self._thread.start()

    # -- Pathway callbacks (engine thread) ---------------------------------------------

    def on_change(self, key: pw.Pointer, row: dict, time: int, is_addition: bool) -> None:
        # One input version's rows: each keeps its own sign (an input's delete arrives
        # as diff -1), negated when Pathway itself retracts the batch.
        rows: pa.Table = row["rows"].value
        if rows.num_rows:
            self._batches.append((rows, time, 1 if is_addition else -1))
        source, version = row["source"], row["version"]
        if version > self._seen.get(source, -1):
            self._seen[source] = version

    def on_time_end(self, time: int) -> None:
        if self._error is not None:
            if self.on_failure is not None:  # the ETL is stopping its sources already
                self._batches = []
                return
            raise RuntimeError(f"Delta sink of {self.appender.table} failed") from self._error
        seen = dict(self._seen)
        if not self._batches and all(v <= self._delivered.get(s, -1) for s, v in seen.items()):
            return
        # Batches, or input versions with no rows: those still move the positions (and
        # the finished runs recorded with them) in a commit of no rows.
        now = _monotonic()
        with self._lock:
            for source, version in seen.items():
                if version > self._delivered.get(source, -1):
                    self._arrived(source, now)
            self._delivered = seen
            self._pending.append((self._batches, seen))
        self._batches = []
        self._wake.set()

    def seen(self, source: str) -> int:
        """The highest version of `source` whose rows reached this sink."""
        return self._seen.get(source, -1)

    def _arrived(self, source: str, now: float) -> None:
        last = self._last_arrival.get(source)
        self._last_arrival[source] = now
        if last is None or now - last > PAUSE_INTERVALS * self.commit_interval:
            return  # the first delivery, or one after a pause: no cadence in it
        self._gaps.setdefault(source, deque(maxlen=CADENCE_GAPS)).append(now - last)

    def _cadence(self, source: str) -> float:
        """Seconds between `source`'s deliveries (CADENCE_GAPS)."""
        gaps = self._gaps.get(source)
        return max(self.commit_interval, min(gaps)) if gaps else self.commit_interval

    def on_end(self) -> None:
        self.on_time_end(0)
        self._closing = True
        self._wake.set()
        self._thread.join()
        if self.checkpointer:
            self.checkpointer.close()
        if self._error is not None and self.on_failure is None:
            raise RuntimeError(f"Delta sink of {self.appender.table} failed") from self._error

    # -- committer thread ---------------------------------------------------------------

    def _commit_loop(self) -> None:
        """Commit as soon as rows are waiting, about once per commit interval at most.

        Waiting for a fixed tick would add half an interval of latency on average; this
        commits right after data arrives when the stream is sparse and batches a full
        interval when it is dense. The rate limit is a token bucket (`REFILL_PER_INTERVAL`
        commits per interval, bursts of `BURST`) rather than a minimum gap after the
        previous commit: with a gap, or with a bucket refilled at exactly the rate the
        inputs arrive, one commit delayed by x ms delays every later one by x as well.
        """
        try:
            while True:
                if not self._wake.wait(LEASE_CHECK_S if self.lease is not None else None):
                    self._check_lease()
                    continue
                self._wake.clear()
                if not self._closing:
                    self._gather()
                closing = self._closing
                with self._lock:
                    pending, self._pending = self._pending, []
                if pending:
                    self._tokens -= 1
                    self._commit(pending)
                if closing:
                    return
        except BaseException as exc:  # surfaced to Pathway on its next callback
            # A failure a user can fix (fenced, disk full, read-only, access) becomes one
            # clear error; anything else keeps its traceback for a bug report.
            clear = user_storage_error(exc, self.appender.table)
            if clear is not None:
                if clear is not exc:
                    clear.__cause__ = exc
                log.error("Delta sink stopped: %s", clear.problem)
                exc = clear
            else:
                log.exception("Delta sink commit failed")
            self._error = exc
            if self.on_failure is not None:
                # Pathway calls back only when data flows: an idle ETL would otherwise
                # live on with a dead sink. The ETL stops its sources on this.
                self.on_failure(exc)

    def _check_lease(self) -> None:
        """Idle: raise `FencedError` if a newer writer has claimed the table meanwhile."""
        assert self.lease is not None
        lease, appender = self.lease, self.appender

        def check() -> None:
            appender.refresh()
            lease.check(appender)

        retry_storage(check, what=f"check the lease on {self.appender.table}")

    @property
    def error(self) -> BaseException | None:
        """Why the committer thread stopped, if it failed."""
        return self._error

    def _token_wait(self) -> float:
        """Seconds until the rate limit allows the next commit."""
        now = _monotonic()
        per_token = self.commit_interval / REFILL_PER_INTERVAL
        self._tokens = min(BURST, self._tokens + (now - self._refilled) / per_token)
        self._refilled = now
        return max(0.0, (1 - self._tokens) * per_token)

    def _gather(self) -> None:
        """Wait until the rate limit allows a commit and every active input has delivered.

        A producer commits several inputs for the same window at about the same moment
        (the time-zone producer both of its tables), but their tails pick them up a few
        milliseconds apart. Committing the first alone
        would make the second wait for the next commit, so the sink lingers until each
        input that delivered within its last two cadences, and whose next batch is due
        within its linger (half its cadence), has delivered again; an input that went
        quiet stops being waited for. An input's cadence is the time between its
        deliveries: one interval, or P intervals for a partition that the sticky
        partitioner feeds one window in P (whose commits a reader then expects P
        intervals apart, so a split commit costs it more); see
        docs/adr/0030-sink-commit-rate-limit.md.
        """
        arrived = _monotonic()
        while not self._closing:
            with self._lock:
                delivered = self._pending[-1][1] if self._pending else {}
                awaited = {s for s, t in self._last_arrival.items() if self._awaited(s, t, arrived)}
            fresh = {s for s, v in delivered.items() if v > self.positions.get(s, -1)}
            now = _monotonic()
            until = now + self._token_wait()
            if not awaited <= fresh:
                until = max(until, arrived + max(self._linger(s) for s in awaited - fresh))
            if now >= until:
                return
            self._wake.wait(until - now)
            self._wake.clear()

    def _awaited(self, source: str, last: float, arrived: float) -> bool:
        """Whether `source`'s next batch is worth waiting for: it delivered within its
        last two cadences, and its next batch (a cadence after its last) is due within
        its linger; one that delivered moments ago, and whose rows went out in the
        previous commit, would keep this commit waiting for nothing."""
        cadence = self._cadence(source)
        return arrived - 2 * cadence <= last <= arrived + self._linger(source) - cadence

    def _linger(self, source: str) -> float:
        """How long a commit may wait for `source`: half its cadence."""
        return LINGER_SHARE * self._cadence(source)

    def _commit(self, pending: list) -> None:
        positions = pending[-1][1]
        table = self.to_table([batch for batches, _ in pending for batch in batches])
        seq = self.seq
        started = time.monotonic()
        info: dict[str, object] = {"etl.positions": positions, "etl.seq": seq}
        if self.lease is not None:  # who wrote it: names the holder to a second writer
            info.update({"etl.epoch": self.lease.epoch, "etl.owner": self.lease.owner})
        if self.commit_info:
            info.update(self.commit_info())
        self.appender.append_once(
            table,
            app_id=self.app_id,
            seq=seq,
            custom_metadata=metadata(**info),
            what=f"commit to {self.appender.table}",
            checkpointer=self.checkpointer,
            fence=self.lease.check if self.lease is not None else None,
            markers={position_marker(self.app_id, t): v for t, v in positions.items() if v >= 0},
        )
        self.seq += 1
        self.positions = positions
        self.stats.rows += table.num_rows
        self.stats.commits += 1
        self.stats.version = self.appender.version()
        self.stats.last_commit_ms = (time.monotonic() - started) * 1000
