"""Retry with backoff for storage calls that fail for a passing reason (an outage).

Errors a user must fix (credentials, missing bucket, bad data) are raised at once;
connection-level failures are retried with capped exponential backoff and a log line
saying what we are waiting for, so a MinIO restart costs time, never data.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from deltabus.errors import ConfigError, DeltabusError, user_storage_error

T = TypeVar("T")
log = logging.getLogger(__name__)

TRANSIENT_MARKERS = (
    "connection refused",
    "error sending request",
    "connection reset",
    "connection closed",
    "broken pipe",
    "timed out",
    "timeout",
    "service unavailable",
    "503",
    "500 internal",
    "502",
    "504",
    "slowdown",
    "dns error",
    "tcp connect error",
    "failed to fetch",
    "io error",
    "request or response body error",
    "xminioservernotinitialized",
    "server not initialized",
    "could not connect to the endpoint",
    "connection was closed",
    "read timeout",
    "connect timeout",
    "network_connection",  # pyarrow's S3 client
    "could not connect to server",
    "curlcode",
    "http status 499",
)


def is_transient(exc: BaseException) -> bool:
    """True for failures an outage explains (network, 5xx), not for ones a user must fix."""
    if user_storage_error(exc) is not None:
        return False  # read-only or full storage, access denied: waiting will not help
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    if "aws error" in text:
        # pyarrow's S3 client: anything but the user-fixable errors above is the server or
        # the network (it reports a server going down as UNKNOWN, HTTP 499 or 503).
        return True
    return any(marker in text for marker in TRANSIENT_MARKERS)


MAX_WAIT_VAR = "DELTABUS_RETRY_MAX_WAIT_S"
DEFAULT_MAX_WAIT_S = 300.0
_configured_max_wait: float | None = None


def configure(max_wait: float | None) -> None:
    """Use this retry budget (seconds) in this process, e.g. `Settings.retry_max_wait_s`,
    which may come from a `.env` file; None goes back to the environment variable."""
    global _configured_max_wait
    _configured_max_wait = None if max_wait is None else float(max_wait)


def parse_max_wait(text: str) -> float:
    """The retry budget from the environment variable's text; ConfigError when invalid."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"invalid settings: {MAX_WAIT_VAR}={text!r} is not a number of seconds >= 0",
            f"set {MAX_WAIT_VAR} to how long storage calls may retry, e.g. 300",
        )
    return value


def max_wait_s() -> float:
    """How long storage calls retry: the configured budget, else $DELTABUS_RETRY_MAX_WAIT_S."""
    if _configured_max_wait is not None:
        return _configured_max_wait
    text = os.environ.get(MAX_WAIT_VAR)
    return DEFAULT_MAX_WAIT_S if text is None else parse_max_wait(text)


# A process asked to stop (SIGTERM, Ctrl-C) keeps retrying an outage only this long.
STOP_GRACE_S = 5.0
_stop_events: list[threading.Event] = []


@contextmanager
def stop_waiting_on(event: threading.Event) -> Iterator[None]:
    """While inside, a set `event` cuts every retry wait in this process short.

    Without it, an ETL stopped during an outage kept retrying for the whole budget
    (minutes) before it exited. Giving up loses nothing: a position only advances with
    the commit that carries its rows, so the next run reads again what was not committed.
    """
    _stop_events.append(event)
    try:
        yield
    finally:
        _stop_events.remove(event)


def _stop_requested() -> bool:
    return any(event.is_set() for event in _stop_events)


def _pause(seconds: float) -> None:
    """Sleep, waking early once a stop is requested."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and not _stop_requested():
        time.sleep(min(left, 0.05))


class StoppedDuringOutage(DeltabusError):
    """A stop was requested while storage was unavailable."""


def retry_storage(
    fn: Callable[[], T],
    *,
    what: str,
    first_delay: float = 0.1,
    max_delay: float = 5.0,
    max_wait: float | None = None,
    also_retry: Callable[[BaseException], bool] | None = None,
    transient: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Call `fn`, retrying transient storage failures with capped exponential backoff.

    `also_retry` marks further retryable failures (commit conflicts): those are retried
    quickly and quietly, since they mean contention rather than an outage. `transient`
    tells outages from other failures (default: `is_transient`).
    """
    budget = max_wait_s() if max_wait is None else max_wait
    deadline = time.monotonic() + budget
    stopping = False
    delay = first_delay
    attempt = 0
    while True:
        try:
            return fn()
        except DeltabusError:
            raise  # a problem a user must fix (or a fenced writer): never retried
        except Exception as exc:  # noqa: BLE001 - classified below
            attempt += 1
            if also_retry is not None and also_retry(exc) and time.monotonic() < deadline:
                log.debug("%s: %s; retrying", what, exc)
                time.sleep(random.uniform(0.001, 0.005 * min(attempt, 10)))
                continue
            if not transient(exc):
                raise
            if not stopping and _stop_requested():
                stopping = True  # a few more tries for a blip, then give up
                deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
                delay = min(delay, 1.0)
            if time.monotonic() + delay > deadline:
                if stopping:
                    raise StoppedDuringOutage(
                        f"stopped while the storage was unavailable ({what}); what was not "
                        "committed yet is read again by the next run, nothing is lost",
                        "bring the storage back (check the endpoint and that MinIO runs), "
                        "then start again",
                    ) from exc
                raise
            first_line = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            log.warning(
                "storage unavailable during %s (attempt %d, %s); retrying in %.1fs",
                what,
                attempt,
                first_line,
                delay,
            )
            if stopping:
                time.sleep(delay)  # the stop is set already: _pause would not wait at all
            else:
                _pause(delay)
            delay = min(max_delay if not stopping else 1.0, delay * 2)
