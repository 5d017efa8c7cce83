"""Several batches' writes in flight at once, their positions moved strictly in order.

A sink that waits for each batch to become searchable before it sends the next one is
bound by the store's refresh, not by its capacity (docs/adr/0005-opensearch-sink.md).
`BulkPipeline` sends the next batch while earlier ones are still in flight, and commits
(moves the position for) a batch only after every batch before it has committed, so the
stored position never passes a batch that did not land.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")


class BulkPipeline:
    """Up to `in_flight` batches at once; each is `send` (beside the others), then
    `commit` (after its predecessor's commit). A failed batch stops the batches after it
    from committing, and its failure is raised by the next `submit`, `check` or
    `drain`, after which the pipeline is empty."""

    def __init__(self, in_flight: int, name: str = "bulk") -> None:
        if in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        self.in_flight = in_flight
        self._pool = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix=name)
        self._slots = threading.BoundedSemaphore(in_flight)
        self._jobs: deque[Future[None]] = deque()

    def submit(self, send: Callable[[], T], commit: Callable[[T], None]) -> None:
        """Queue one batch; blocks while `in_flight` batches are in flight."""
        self.check()
        self._slots.acquire()
        previous = self._jobs[-1] if self._jobs else None

        def job() -> None:
            try:
                result = send()
                if previous is not None:
                    previous.result()  # its failure is this batch's: nothing commits after it
                commit(result)
            finally:
                self._slots.release()

        try:
            self._jobs.append(self._pool.submit(job))
        except BaseException:
            self._slots.release()
            raise

    def pending(self) -> int:
        """Batches submitted and not yet finished."""
        return sum(1 for job in self._jobs if not job.done())

    def check(self) -> None:
        """Forget the batches that committed; raise the first failure, if any."""
        while self._jobs and self._jobs[0].done():
            failure = self._jobs.popleft().exception()
            if failure is not None:
                self._settle()
                raise failure

    def drain(self) -> None:
        """Wait for every batch in flight; raise the first failure, if any."""
        wait(list(self._jobs))
        self.check()

    def close(self) -> None:
        """Wait for the batches in flight, dropping their failures, and stop the threads."""
        self._settle()
        self._pool.shutdown(wait=True)

    def _settle(self) -> None:
        wait(list(self._jobs))
        self._jobs.clear()
