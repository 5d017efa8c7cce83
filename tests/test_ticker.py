"""The commit ticker in a real Pathway dataflow of two outputs, each fed by two inputs:
rows of one input reach their output while the other input is silent, the other
output's inputs are not committed meanwhile, and the ticks stop once the rows are out."""

from __future__ import annotations

import threading
import time

import pathway as pw

from deltabus.apps.timezones.etl.ticker import CommitTicker, TickGroup


class Row(pw.Schema):
    n: int


class Scripted(pw.io.python.ConnectorSubject):
    """Sends the rows of each step, then waits for the next step (or the end)."""

    def __init__(self, steps: list[list[int]], go: list[threading.Event], done: threading.Event):
        super().__init__()
        self.steps, self.go, self.done = steps, go, done
        self.on_sent = None
        self.sent = 0
        self.commits = 0

    def commit(self) -> None:
        self.commits += 1
        super().commit()

    def run(self) -> None:
        for rows, go in zip(self.steps, self.go, strict=True):
            go.wait()
            if (
                rows and self.on_sent
            ):  # as deltabus.apps.timezones.etl.source: a fresh time for the rows
                self.commit()
            self.sent += len(rows)
            for n in rows:
                self.next(n=n)
            if rows and self.on_sent:
                self.on_sent()
        self.done.wait()


def test_ticks_follow_the_rows_to_their_output_and_stop() -> None:
    go = [threading.Event(), threading.Event()]
    done = threading.Event()
    busy = Scripted([[1, 2, 3], [4, 5]], go, done)
    quiet = Scripted([[], []], go, done)  # never sends a row, never commits by itself
    other = [Scripted([[], []], go, done) for _ in range(2)]  # another output's inputs
    arrived: dict[int, float] = {}
    ticker = CommitTicker(
        [
            TickGroup([busy, quiet], lambda: len(arrived) < busy.sent),
            TickGroup(other, lambda: False),
        ],
        interval=0.01,
    )
    for subject in (busy, quiet, *other):
        subject.on_sent = ticker.rows_sent

    def stream(subject: Scripted) -> pw.Table:
        return pw.io.python.read(subject, schema=Row, autocommit_duration_ms=None)

    def on_change(key, row, **_: object) -> None:
        arrived[row["n"]] = time.monotonic()

    pw.io.subscribe(pw.Table.concat_reindex(stream(busy), stream(quiet)), on_change)
    pw.io.subscribe(pw.Table.concat_reindex(*(stream(s) for s in other)), lambda **_: None)
    seen: dict[str, int] = {}

    def script() -> None:
        try:
            sent1 = time.monotonic()
            go[0].set()
            wait_for(lambda: len(arrived) == 3)
            seen["first_latency_ms"] = int((max(arrived.values()) - sent1) * 1000)
            time.sleep(0.1)
            seen["idle_start"] = ticker.ticks
            time.sleep(0.3)
            seen["idle_end"] = ticker.ticks
            sent2 = time.monotonic()
            go[1].set()
            wait_for(lambda: len(arrived) == 5)
            seen["second_latency_ms"] = int((max(arrived[4], arrived[5]) - sent2) * 1000)
            seen["other_commits"] = sum(s.commits for s in other)
        finally:  # end the dataflow whatever happened
            for event in (*go, done):
                event.set()

    driver = threading.Thread(target=script, daemon=True)
    driver.start()
    ticker.start()
    try:
        pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    finally:
        ticker.close()
    driver.join(5)

    assert sorted(arrived) == [1, 2, 3, 4, 5]
    assert {"first_latency_ms", "second_latency_ms"} <= seen.keys(), seen
    # The quiet input is committed with the busy one, so the rows are not held back;
    # without a tick after the send they would wait for the dataflow's end.
    assert seen["first_latency_ms"] < 500, seen
    assert seen["second_latency_ms"] < 500, seen
    assert quiet.commits > 0
    assert seen["idle_start"] > 0
    assert seen["idle_end"] == seen["idle_start"], "the ticker kept ticking after delivery"
    assert seen["other_commits"] == 0, "inputs of an output with nothing in flight ticked"


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
