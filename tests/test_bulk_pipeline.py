"""BulkPipeline: batches sent side by side, committed strictly in order, and a failed
batch commits nothing after it."""

from __future__ import annotations

import threading
import time

import pytest

from deltabus.adapters.serving.bulk_pipeline import BulkPipeline


def test_batches_are_sent_together_and_committed_in_order() -> None:
    pipeline = BulkPipeline(3)
    committed: list[int] = []
    in_send = threading.Barrier(3, timeout=10)

    def send(n: int) -> int:
        in_send.wait()  # all three must be in flight at once, or this times out
        time.sleep(0.05 * (3 - n))  # the first sent finishes last
        return n

    for n in range(3):
        pipeline.submit(lambda n=n: send(n), committed.append)
    pipeline.drain()
    assert committed == [0, 1, 2]
    pipeline.close()


def test_a_failed_batch_commits_nothing_after_it_and_is_raised_once() -> None:
    pipeline = BulkPipeline(2)
    committed: list[int] = []
    release = threading.Event()

    def fail() -> int:
        release.wait(10)
        raise ConnectionError("node gone")

    pipeline.submit(fail, committed.append)
    pipeline.submit(lambda: 2, committed.append)
    release.set()
    with pytest.raises(ConnectionError):
        pipeline.drain()
    assert committed == []
    pipeline.drain()  # the failure was raised once; the pipeline is empty again
    pipeline.submit(lambda: 3, committed.append)
    pipeline.drain()
    assert committed == [3]
    pipeline.close()


def test_submit_blocks_while_the_pipeline_is_full() -> None:
    pipeline = BulkPipeline(1)
    release = threading.Event()
    pipeline.submit(lambda: release.wait(10), lambda _: None)
    second = threading.Thread(target=pipeline.submit, args=(lambda: 1, lambda _: None))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first batch's slot
    release.set()
    second.join(10)
    assert not second.is_alive()
    pipeline.drain()
    pipeline.close()
