"""Poll pacing (deltabus.bus.pacing): in step with the writer, backing off when quiet, and what
a quiet ETL costs on a real MinIO, counted by MinIO's own request metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import polars as pl
import pytest

from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.bus.pacing import Pacer
from deltabus.delta.lake import Lake
from deltabus_bench.cost import RequestMeter
from tests.conftest import lake_env, minio_settings_for
from tests.helpers import etl_process, read_unified, wait_for_file


def test_pacer_follows_the_writer_and_backs_off(local_lake: Lake) -> None:
    lake = Lake(local_lake.settings.model_copy(update={"idle_poll_ms": 400}))
    pacer = Pacer(lake, "t", 0.01, threading.Event())
    for _ in range(6):  # a writer committing every 50 ms
        pacer.found(1)
        time.sleep(0.05)
    assert pacer.gap is not None and 0.04 < pacer.gap < 0.08
    pacer.found(1)
    assert 0.025 < pacer._delay < 0.06  # most of a gap, not the 10 ms poll interval
    time.sleep(0.3)  # the writer went quiet: each miss waits longer, up to the idle cap
    delays = []
    for _ in range(12):
        pacer.found(0)
        delays.append(pacer._delay)
    assert delays == sorted(delays) and delays[-1] == 0.4
    pacer.found(1)  # it commits again: back in step at once
    assert pacer._delay < 0.1


def test_the_next_poll_is_counted_from_the_poll_not_from_the_work_after_it(
    local_lake: Lake,
) -> None:
    """Reading what a poll found takes time; the next poll stays in step with the writer
    (counting its delay after that work made the polls drift behind, commit by commit)."""
    pacer = Pacer(local_lake, "t", 0.01, threading.Event())
    for _ in range(6):  # a writer committing every 100 ms
        pacer.found(1)
        time.sleep(0.1)
    pacer.found(1)
    found = time.monotonic()
    time.sleep(0.05)  # emitting the rows
    pacer.wait()
    assert time.monotonic() - found < 0.095  # ~0.075: before the writer's next commit


def test_a_writer_slower_than_the_idle_cap_is_still_followed(local_lake: Lake) -> None:
    """A first gap inflated by start-up must wash out, also when the writer's gap is near
    the idle cap (1000 ms commits): a stuck estimate locked the polls at a random phase,
    up to a whole interval after each commit."""
    lake = Lake(local_lake.settings.model_copy(update={"idle_poll_ms": 300}))
    pacer = Pacer(lake, "t", 0.01, threading.Event())
    pacer.found(1)
    time.sleep(0.6)  # the first gap: start-up
    for _ in range(8):  # then a commit every 200 ms
        pacer.found(1)
        time.sleep(0.2)
    assert pacer.gap is not None and 0.17 < pacer.gap < 0.3, pacer.gap


def test_stop_ends_a_wait_at_once(local_lake: Lake) -> None:
    lake = Lake(local_lake.settings.model_copy(update={"idle_poll_ms": 60_000}))
    stop = threading.Event()
    pacer = Pacer(lake, "t", 30.0, stop)
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    pacer.wait()
    assert time.monotonic() - start < 1.0


def rows_in_unified(lake: Lake) -> int:
    return read_unified(lake).height if lake.exists("timezone_unified") else 0


def wait_rows(lake: Lake, n: int, timeout: float = 60) -> float:
    start = time.monotonic()
    while rows_in_unified(lake) < n:
        assert time.monotonic() - start < timeout, f"unified never reached {n} rows"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_quiet_etl_costs_little_and_wakes_for_the_next_commit(minio, tmp_path: Path) -> None:
    lake = Lake(minio_settings_for(minio, f"quiet-{time.time_ns()}", idle_poll_ms=500))
    ready = tmp_path / "ready"
    etl = etl_process(lake_env(lake), tmp_path, "--mode", "continuous", "--ready-file", str(ready))
    try:
        wait_for_file(ready, etl)
        config = ProducerConfig(rate=2000, count=400, commit_interval=0.1, run_id="busy")
        TimezoneProducer(lake, config).run()
        wait_rows(lake, 400)
        time.sleep(3)  # long enough for every poll to back off to the idle cap
        meter = RequestMeter(minio.endpoint)
        meter.start()
        time.sleep(5)
        meter.stop()
        idle = meter.per_second()
        # Two input tails at 2 polls/s, the lease check and the expiry check: a few a
        # second, where polling every 20 ms costs 100.
        assert idle is not None and idle["total"] < 8, idle
        start = time.monotonic()
        TimezoneProducer(
            lake, ProducerConfig(rate=100, count=10, commit_interval=0.1, run_id="late")
        ).run()
        # The first commit after the pause is seen within one idle poll (plus the commit).
        assert wait_rows(lake, 410) < 2.0 + (time.monotonic() - start)
    finally:
        etl.terminate()
        etl.communicate(timeout=60)
    unified = read_unified(lake)
    assert unified.height == 410 and unified["message"].n_unique() == 410
    assert unified.filter(pl.col("diff") != 1).height == 0


class FakeClock:
    """Stands in for the `time` module inside deltabus.bus.pacing: simulated seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.wall(self.now)

    @staticmethod
    def wall(monotonic: float) -> float:
        """The wall-clock time at simulated monotonic time `monotonic`."""
        return 1_700_000_000.0 + monotonic


def simulate_tail(
    lake: Lake,
    monkeypatch: pytest.MonkeyPatch,
    *,
    stamped: bool,
    commits: int = 400,
    gap: float = 0.1,
    work: float = 0.002,
    landing: tuple[float, float] = (0.01, 0.03),
    start: float = 0.0,
    settle: int = 50,
) -> tuple[float, float]:
    """A writer commits every `gap` s (100 ms); each commit lands `landing` s (10-30 ms)
    after its timestamp, and the writer's clock runs 2.5 s ahead of the tail's. The tail polls when
    its pacer says, and takes `work` s over each poll and what it found. With `start`,
    commit 0 is the table's creation and commit 1 comes `start` s after it. Returns
    (missed polls per commit, mean seconds from landing to being seen), both measured
    after the first `settle` commits."""
    import random

    import deltabus.bus.pacing as pacing

    clock = FakeClock()
    monkeypatch.setattr(pacing, "time", clock)
    rng = random.Random(7)
    skew = 2.5
    # Commit k: stamped by the writer's clock (ms), landing 10-30 ms later by the tail's.
    at = [gap * k + (start - gap if k and start else 0.0) for k in range(commits)]
    stamps = [(clock.time() + skew + t) * 1000 for t in at]
    lands = [clock.now + t + rng.uniform(*landing) for t in at]
    pacer = Pacer(lake, "t", 0.02, threading.Event())
    misses, pickup, nxt = 0, [], 0
    while nxt < commits:
        clock.now = max(clock.now, pacer._due)
        pacer.wait()  # returns at once (the poll is due), noting whether it is late
        landed = 0
        while nxt + landed < commits and lands[nxt + landed] <= clock.now:
            landed += 1
        if landed:
            if nxt >= settle:
                pickup.extend(clock.now - lands[k] for k in range(nxt, nxt + landed))
            nxt += landed
            pacer.found(landed, stamps[nxt - 1] if stamped else None)
        else:
            misses += nxt >= settle
            pacer.found(0)
        clock.now += work  # the GET and the work on what it found
    return misses / (commits - settle), sum(pickup) / len(pickup)


def test_stamped_commits_aim_the_first_poll_at_the_landing(
    local_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the writer's timestamps a tail misses about one first poll in five, whatever
    the clock skew; pacing by its own hits alone misses more than once per commit."""
    stamped_misses, stamped_pickup = simulate_tail(local_lake, monkeypatch, stamped=True)
    plain_misses, plain_pickup = simulate_tail(local_lake, monkeypatch, stamped=False)
    assert stamped_misses < 0.45, stamped_misses
    assert plain_misses > 0.9, plain_misses
    assert stamped_pickup < 0.015, stamped_pickup  # seen within a poll interval of landing


def test_a_tail_follows_one_second_commits_as_closely(
    local_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 1000 ms commits a tail that kept up from the first commit never learnt the
    writer's gap (it backs off between commits, and gaps seen while backed off were not
    taken): ten misses per commit, and commits seen up to a third of a second late. Also
    when reading a commit takes longer than a poll interval (a busy tail's late looks
    must not move its aim)."""
    for work in (0.002, 0.15):
        misses, pickup = simulate_tail(
            local_lake, monkeypatch, stamped=True, commits=200, gap=1.0, work=work
        )
        assert misses < 0.6, (work, misses)
        assert pickup < 0.03 + work, (work, pickup)


@pytest.mark.parametrize(("start", "gap"), [(1.7, 0.4), (5.0, 0.4), (3.0, 1.0)])
def test_a_first_gap_that_spans_the_writers_start_is_not_its_pace(
    local_lake: Lake, monkeypatch: pytest.MonkeyPatch, start: float, gap: float
) -> None:
    """A partition table created `start` s before its first rows, then committing every
    `gap` s: the tail's first gap is the start. Averaged down from there, the tail looked
    too late for 25-40 commits, moved its aim ever earlier meanwhile, and then missed 2-3
    polls a commit (1.7 s, 3 s) or still saw commits 0.1 s after they landed (5 s), from
    the 10th commit to the 40th. Two short gaps in a row replace the average."""
    misses, pickup = simulate_tail(
        local_lake, monkeypatch, stamped=True, commits=41, gap=gap, start=start, settle=10
    )
    assert misses < 0.6, misses
    assert pickup < 0.03, pickup


def test_a_late_commit_is_polled_for_less_and_less_often(
    local_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 1000 ms commits under load a commit can land anywhere in 10-400 ms after its
    timestamp. Polling every 20 ms until it lands, with the aim moved 8 ms per commit
    found late, cost 2.7 misses per commit in this simulation; polls further apart the
    longer a commit is late, and an aim moved further for misses in a row, under 1.2,
    each commit still seen within about 0.1 s of landing on average."""
    misses, pickup = simulate_tail(
        local_lake, monkeypatch, stamped=True, commits=300, gap=1.0, landing=(0.01, 0.4)
    )
    assert misses < 1.2, misses
    assert pickup < 0.12, pickup


def test_a_look_that_went_out_late_does_not_move_the_aim(
    local_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first look that finds its commit moves the aim earlier; one that went out late,
    because the tail was busy with the rows before, must not: it found the commit only
    because it looked late (the aim of a busy tail at 1000 ms dived 150 ms that way)."""
    import deltabus.bus.pacing as pacing

    clock = FakeClock()
    monkeypatch.setattr(pacing, "time", clock)
    pacer = Pacer(local_lake, "t", 0.02, threading.Event())
    start = clock.now

    def stamp(k: int) -> float:  # the writer's timestamp of commit k, one a second
        return clock.wall(start + k) * 1000

    for k in range(4):  # each found on time, 15 ms after its timestamp
        clock.now = start + k + 0.015
        pacer.wait()
        pacer.found(1, stamp(k))
    aim = pacer.aim
    assert aim is not None
    clock.now = pacer._due + 0.3  # busy: the look goes out 300 ms after it was due
    pacer.wait()
    pacer.found(1, stamp(4))
    assert pacer.aim == aim
    clock.now = pacer._due  # on time, and the commit is there: the aim moves earlier
    pacer.wait()
    pacer.found(1, stamp(5))
    assert pacer.aim is not None and pacer.aim < aim


def test_an_aim_far_too_early_comes_back_in_a_few_commits(
    local_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An aim 0.9 s early (taken at start-up) makes every first look at 1000 ms commits
    miss and polls every 20 ms until the commit lands: by AIM_UP_S a commit it took over
    a hundred commits to come back. It must be back within fifteen."""
    import deltabus.bus.pacing as pacing

    clock = FakeClock()
    monkeypatch.setattr(pacing, "time", clock)
    pacer = Pacer(local_lake, "t", 0.02, threading.Event())
    start = clock.now

    def lands(k: int) -> float:  # commit k: stamped at start + k, landed 20 ms later
        return start + k + 0.02

    misses = []
    for k in range(30):
        missed = 0
        while True:
            clock.now = max(clock.now, pacer._due)
            pacer.wait()
            if clock.now >= lands(k):
                pacer.found(1, clock.wall(start + k) * 1000)
                break
            missed += 1
            pacer.found(0)
            clock.now += 0.002
        misses.append(missed)
        if k == 3:
            pacer.aim = -0.9
    assert sum(misses[4:]) > 20  # it did start far too early
    # Back within fifteen: from there on, the usual sawtooth of an aim that comes down
    # until a first look misses (one or two polls), not a poll every 20 ms.
    assert max(misses[19:]) <= 2 and sum(misses[19:]) <= 6, misses


def test_a_tail_reads_on_only_when_the_next_commit_is_due(
    local_lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a fresh commit the next one is not due: reading on would be a GET that finds
    nothing. A commit older than a gap means the tail is behind: it reads on."""
    import deltabus.bus.pacing as pacing

    clock = FakeClock()
    monkeypatch.setattr(pacing, "time", clock)
    pacer = Pacer(local_lake, "t", 0.02, threading.Event())
    assert pacer.next_landed(clock.time() * 1000)  # nothing measured yet: read on
    for _ in range(5):  # commits every 100 ms, each seen 15 ms after its timestamp
        stamp = clock.time() * 1000
        clock.now += 0.015
        pacer.found(1, stamp)
        clock.now += 0.085
    fresh = clock.time() * 1000 - 15
    assert not pacer.next_landed(fresh)
    assert pacer.next_landed(fresh - 150)  # two gaps old: the next one has landed
    assert pacer.next_landed(0)  # no timestamp: read on
