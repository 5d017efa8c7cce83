"""The Delta sink's commit policy: rate limit and shared commits, on a real Delta table.

The sink is driven directly through its Pathway callbacks (`on_change`, `on_time_end`)
so the timing of arrivals is under the test's control; the commits are real delta-rs
appends to a local table.
"""

from __future__ import annotations

import time

from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.etl.sink import DeltaSinkObserver, open_unified
from deltabus.connectors.pathway.sink import BURST, REFILL_PER_INTERVAL
from deltabus.delta.lake import Lake
from tests.helpers import batch_row

SOURCES = ("timezone1", "timezone2")


def deliver(sink: DeltaSinkObserver, source: str, version: int, n: int = 5) -> None:
    """One Pathway time carrying `n` rows of one input version."""
    now = int(time.time() * 1000)
    row = batch_row(source, version, [f"{source}-{version}-{i}" for i in range(n)])
    sink.on_change(None, row, now, True)  # type: ignore[arg-type]
    sink.on_time_end(now)


def new_sink(lake: Lake, interval: float) -> DeltaSinkObserver:
    output = open_unified(lake, UNIFIED_TABLE, list(SOURCES), "test", fence=False)
    return DeltaSinkObserver(output, interval)


def wait_for(predicate, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_commits_are_rate_limited_and_nothing_is_lost(local_lake: Lake) -> None:
    interval = 0.3
    sink = new_sink(local_lake, interval)
    started = time.monotonic()
    for version in range(30):  # a version every 10 ms: far more often than the limit
        deliver(sink, "timezone1", version)
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    sink.on_end()
    # The rate limit's commits per interval plus a burst, plus the final flush.
    assert 2 <= sink.stats.commits <= BURST + REFILL_PER_INTERVAL * elapsed / interval + 2
    assert sink.stats.rows == 150
    assert sink.positions["timezone1"] == 29
    table = local_lake.open(UNIFIED_TABLE).to_pyarrow_table()
    assert table.num_rows == 150
    assert len(set(table.column("message").to_pylist())) == 150


def test_inputs_arriving_apart_share_one_commit(local_lake: Lake) -> None:
    interval = 0.4  # the sink lingers up to 0.2 s for the other active input
    sink = new_sink(local_lake, interval)
    deliver(sink, "timezone1", 0)
    deliver(sink, "timezone2", 0)
    wait_for(lambda: sink.stats.commits >= 1 and sink.positions["timezone2"] == 0)
    before = sink.stats.commits
    time.sleep(interval)  # the rate limit has a token again
    deliver(sink, "timezone1", 1)
    time.sleep(0.05)  # the other input's batch comes 50 ms later
    deliver(sink, "timezone2", 1)
    wait_for(lambda: sink.positions == {"timezone1": 1, "timezone2": 1})
    assert sink.stats.commits == before + 1
    sink.on_end()


def test_a_quiet_input_is_not_waited_for(local_lake: Lake) -> None:
    interval = 1.0  # a linger would take 0.5 s
    sink = new_sink(local_lake, interval)
    deliver(sink, "timezone1", 0)
    deliver(sink, "timezone2", 0)
    wait_for(lambda: sink.positions == {"timezone1": 0, "timezone2": 0})
    time.sleep(2 * interval + 0.1)  # timezone2 delivered nothing for two intervals
    delivered = time.monotonic()
    deliver(sink, "timezone1", 1)
    wait_for(lambda: sink.positions["timezone1"] == 1)
    assert time.monotonic() - delivered < 0.35, "lingered for an input that went quiet"
    sink.on_end()


def test_one_late_commit_does_not_delay_the_later_ones(local_lake: Lake) -> None:
    """Both inputs deliver once per interval. Once, the second input comes too late to
    share a commit, so two commits fall in one interval and use up the rate limit's
    slack. The commits after it must come back in step with the deliveries, not wait for
    the rate limit at a fixed offset from then on."""
    interval = 0.2
    sink = new_sink(local_lake, interval)
    start = time.monotonic()
    waits: list[float] = []
    for cycle in range(14):
        due = start + cycle * interval
        time.sleep(max(0.0, due - time.monotonic()))
        deliver(sink, "timezone1", cycle)
        if cycle == 3:  # past the linger: timezone1's rows are committed alone
            time.sleep(0.6 * interval)
        delivered = time.monotonic()
        deliver(sink, "timezone2", cycle)
        wait_for(lambda c=cycle: sink.positions == {"timezone1": c, "timezone2": c})
        waits.append(time.monotonic() - delivered)
    sink.on_end()
    assert max(waits[:3]) < 0.05, waits  # in step before the late delivery
    assert max(waits[-4:]) < 0.05, waits  # and again a few intervals after it
    assert sink.stats.rows == 14 * 2 * 5


def test_an_input_just_committed_is_not_waited_for_again(local_lake: Lake) -> None:
    """The first input's batch went out in a commit of its own; when the second input's
    batch of the same round arrives, the sink must not linger for the first input's next
    batch, which is an interval away."""
    interval = 1.0  # a linger would take 0.5 s
    sink = new_sink(local_lake, interval)
    deliver(sink, "timezone1", 0)  # the only active input: committed at once
    wait_for(lambda: sink.positions["timezone1"] == 0)
    delivered = time.monotonic()
    deliver(sink, "timezone2", 0)
    wait_for(lambda: sink.positions["timezone2"] == 0)
    assert time.monotonic() - delivered < 0.25, "lingered for an input it had just committed"
    sink.on_end()


def test_inputs_fed_every_other_window_still_share_one_commit(local_lake: Lake) -> None:
    """A partition that the sticky partitioner feeds one window in two delivers every two
    intervals, in either order. Waiting only for inputs seen within two intervals would
    miss the other input about every time and split each round in two commits."""
    interval = 0.2
    sink = new_sink(local_lake, interval)
    start = time.monotonic()
    commits: list[int] = []
    for cycle in range(8):
        due = start + cycle * 2 * interval
        time.sleep(max(0.0, due - time.monotonic()))
        first, second = SOURCES if cycle % 2 == 0 else SOURCES[::-1]
        before = sink.stats.commits
        deliver(sink, first, cycle)
        time.sleep(0.04)
        deliver(sink, second, cycle)
        wait_for(lambda c=cycle: sink.positions == {"timezone1": c, "timezone2": c})
        commits.append(sink.stats.commits - before)
    sink.on_end()
    assert commits[2:] == [1] * 6, commits  # once both cadences are known: one commit a round
    assert sink.stats.rows == 8 * 2 * 5
