"""Hedged requests: one slower than the store usually is gets a second, identical request.

An object store's latency has a long tail: a small GET that usually takes tens of
milliseconds now and then takes hundreds, which every hop of a stream pays in turn. Like
S3's own guidance (retry a request still unanswered well past its usual time), `get`
sends the same GET again once the first has taken longer than the 95th percentile of the
store's recent GETs, and returns whichever answers first. A GET is idempotent, so the
second request costs only itself: about one GET in twenty (docs/adr/0004-hedged-reads.md).
On a local store (a median GET under 5 ms) requests are only timed, not hedged.
`put_new` does the same for a PUT that creates an object (If-None-Match): when both
requests of a pair are refused because the object exists, it reads the object back, and
only a body other than ours is a rival's.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import obstore
from obstore.exceptions import AlreadyExistsError, PreconditionError

# Until this many GETs were timed, hedge after DEFAULT_AFTER_S.
MIN_SAMPLES = 20
DEFAULT_AFTER_S = 0.05
# Never hedge sooner than this: on a store answering in a millisecond, a hedge would only
# double the requests of a scheduling hiccup.
FLOOR_S = 0.005
WINDOW = 256  # recent GET latencies the percentile is taken over
RECOMPUTE_EVERY = 32
HEDGE_PERCENTILE = 0.95
T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="hedged-get")
# Reads sent ahead of their need: a data file announced with its commit, and a tail's
# read-ahead window of log entries and their files (deltabus.bus.tail).
_AHEAD = ThreadPoolExecutor(max_workers=16, thread_name_prefix="get-ahead")
# A store whose median GET takes longer than this is remote: a GET sent ahead of need
# saves a round trip there, and on loopback would only add a request.
REMOTE_MEDIAN_S = 0.005


class GetTimer:
    """The recent latencies of one store's GETs, and the delay after which to hedge."""

    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()
        self._after = DEFAULT_AFTER_S
        self._since = 0
        self.enabled = False  # set by the store's owner (`Lake.object_store`)
        self.sent = 0  # GETs asked for
        self.hedged = 0  # of them, how many got a second request

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._samples.append(seconds)
            self._since += 1
            if len(self._samples) >= MIN_SAMPLES and self._since >= RECOMPUTE_EVERY:
                ordered = sorted(self._samples)
                index = min(len(ordered) - 1, int(HEDGE_PERCENTILE * len(ordered)))
                self._after = max(FLOOR_S, ordered[index])
                self._since = 0

    @property
    def median_s(self) -> float | None:
        """The median of the recent GETs; None until MIN_SAMPLES were timed."""
        with self._lock:
            if len(self._samples) < MIN_SAMPLES:
                return None
            return sorted(self._samples)[len(self._samples) // 2]

    @property
    def after_s(self) -> float:
        """Seconds after which a GET still unanswered is sent again."""
        return self._after


_timers: dict[tuple[int, str], GetTimer] = {}
_timers_lock = threading.RLock()  # a store finalised while held calls `_forget`


def timer_of(store: Any, kind: str = "GET") -> GetTimer:
    """The timer of `kind` requests ("GET" or "PUT") through `store` (one per store
    object, so per lake and process). Requests through a store whose GET timer is not
    `enabled` are sent once, as obstore would."""
    with _timers_lock:
        found = _timers.get((id(store), kind))
        if found is None:
            if not any(key[0] == id(store) for key in list(_timers)):
                # A store's id may be reused once it is gone: its timers go with it.
                weakref.finalize(store, _forget, id(store))
            found = _timers[(id(store), kind)] = GetTimer()
        return found


def _forget(store_id: int) -> None:
    with _timers_lock:
        for key in [key for key in _timers if key[0] == store_id]:
            del _timers[key]


def remote(store: Any) -> bool:
    """True when `store`'s recent GETs have a median above REMOTE_MEDIAN_S (hedging on)."""
    timer = timer_of(store)
    median = timer.median_s
    return timer.enabled and median is not None and median > REMOTE_MEDIAN_S


def _is_remote(timer: GetTimer) -> bool:
    """Hedging pays where requests take long: until the GETs' median is known, assume so."""
    median = timer.median_s
    return median is None or median > REMOTE_MEDIAN_S


def get_later(store: Any, key: str) -> Future[bytes]:
    """`get(store, key)` on a thread of its own pool: its answer when it is needed."""
    return _AHEAD.submit(get, store, key)


def submit_ahead(fn: Callable[..., T], *args: Any) -> Future[T]:
    """`fn(*args)` on the read-ahead pool: for reads sent before they are needed."""
    return _AHEAD.submit(fn, *args)


def _fetch(store: Any, key: str, timer: GetTimer) -> bytes:
    started = time.monotonic()
    try:
        return bytes(obstore.get(store, key).bytes())
    finally:
        timer.observe(time.monotonic() - started)


def get(store: Any, key: str) -> bytes:
    """The bytes of `key` in `store`; raises what obstore raises (FileNotFoundError for a
    missing key). A GET still unanswered after the store's recent p95 is sent again, and
    the first answer wins; an error waits for the other request before it is raised."""
    timer = timer_of(store)
    if not timer.enabled:
        return bytes(obstore.get(store, key).bytes())
    timer.sent += 1
    if not _is_remote(timer):  # a local store: no thread hop, only the timing
        return _fetch(store, key, timer)
    first = _POOL.submit(_fetch, store, key, timer)
    try:
        return first.result(timeout=timer.after_s)
    except TimeoutError:
        pass
    timer.hedged += 1
    second = _POOL.submit(_fetch, store, key, timer)
    return _first_answer([first, second])


def _put(store: Any, key: str, body: bytes, timer: GetTimer) -> None:
    started = time.monotonic()
    try:
        obstore.put(store, key, body, mode="create")
    finally:
        timer.observe(time.monotonic() - started)


def put_new(store: Any, key: str, body: bytes) -> None:
    """Create `key` holding `body`; raises `AlreadyExistsError` when another writer created
    it first (with other bytes). A PUT still unanswered after the store's recent p95 of
    PUTs is sent again. A refusal because the object exists is a success when the object
    holds `body`, so a retried or hedged create never fails on its own earlier request."""
    try:
        _put_hedged(store, key, body)
    except (AlreadyExistsError, PreconditionError):
        # Ours when it holds our bytes: the other request of a pair, or an earlier attempt
        # whose answer was lost, created it.
        if bytes(obstore.get(store, key).bytes()) != body:
            raise


def _put_hedged(store: Any, key: str, body: bytes) -> None:
    gets = timer_of(store)
    if not gets.enabled:
        obstore.put(store, key, body, mode="create")
        return
    timer = timer_of(store, "PUT")
    timer.sent += 1
    if not _is_remote(gets):
        _put(store, key, body, timer)
        return
    first = _POOL.submit(_put, store, key, body, timer)
    try:
        first.result(timeout=timer.after_s)
        return
    except TimeoutError:
        pass
    timer.hedged += 1
    second = _POOL.submit(_put, store, key, body, timer)
    _first_success([first, second])


def _first_success(pending: list[Future[None]]) -> None:
    """Return once one of `pending` succeeded; else raise the first error."""
    error: BaseException | None = None
    waiting = set(pending)
    while waiting:
        done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
        for future in done:
            exc = future.exception()
            if exc is None:
                return
            error = error or exc
    assert error is not None
    raise error


def _first_answer(pending: list[Future[bytes]]) -> bytes:
    """The first result among `pending`; a missing key is an answer, any other error
    waits for the rest and is raised only when none of them succeeds."""
    error: BaseException | None = None
    waiting = set(pending)
    while waiting:
        done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
        for future in done:
            exc = future.exception()
            if exc is None:
                return future.result()
            if isinstance(exc, FileNotFoundError):
                raise exc
            error = error or exc
    assert error is not None
    raise error
