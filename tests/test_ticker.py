"""The commit ticker in a real Pathway dataflow: rows of one input reach the output while
the other input is silent, the ticks stop when the inputs go idle, and they start again
with the next rows."""

from __future__ import annotations

import threading
import time

import pathway as pw

from deltabus.etl.ticker import CommitTicker


class Row(pw.Schema):
    n: int


class Scripted(pw.io.python.ConnectorSubject):
    """Sends the rows of each step, then waits for the next step (or the end)."""

    def __init__(self, steps: list[list[int]], go: list[threading.Event], done: threading.Event):
        super().__init__()
        self.steps, self.go, self.done = steps, go, done
        self.on_sent = None

    def run(self) -> None:
        for rows, go in zip(self.steps, self.go, strict=True):
            go.wait()
            if rows and self.on_sent:  # as deltabus.etl.source: a fresh time for the rows
                self.commit()
            for n in rows:
                self.next(n=n)
            if rows and self.on_sent:
                self.on_sent()
        self.done.wait()


def test_ticks_follow_the_rows_and_stop_when_idle() -> None:
    go = [threading.Event(), threading.Event()]
    done = threading.Event()
    busy = Scripted([[1, 2, 3], [4, 5]], go, done)
    quiet = Scripted([[], []], go, done)  # never sends a row, never commits by itself
    ticker = CommitTicker([busy, quiet], interval=0.01, linger=0.3)
    busy.on_sent = quiet.on_sent = ticker.rows_sent

    streams = [pw.io.python.read(s, schema=Row, autocommit_duration_ms=None) for s in (busy, quiet)]
    both = pw.Table.concat_reindex(*streams)
    arrived: dict[int, float] = {}

    def on_change(key, row, **_: object) -> None:
        arrived[row["n"]] = time.monotonic()

    pw.io.subscribe(both, on_change)
    ticks: dict[str, int] = {}

    def script() -> None:
        try:
            sent1 = time.monotonic()
            go[0].set()
            wait_for(lambda: len(arrived) == 3)
            ticks["first_latency_ms"] = int((max(arrived.values()) - sent1) * 1000)
            time.sleep(0.6)  # past the linger: the ticker must have stopped
            ticks["idle_start"] = ticker.ticks
            time.sleep(0.5)
            ticks["idle_end"] = ticker.ticks
            sent2 = time.monotonic()
            go[1].set()
            wait_for(lambda: len(arrived) == 5)
            ticks["second_latency_ms"] = int((max(arrived[4], arrived[5]) - sent2) * 1000)
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
    assert {"first_latency_ms", "second_latency_ms"} <= ticks.keys(), ticks
    # The quiet input is committed with the busy one, so the rows are not held back.
    assert ticks["first_latency_ms"] < 500, ticks
    assert ticks["second_latency_ms"] < 500, ticks
    assert ticks["idle_start"] > 0
    assert ticks["idle_end"] == ticks["idle_start"], "the ticker kept ticking while idle"


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
