"""Retry with backoff for storage calls that fail for a passing reason (an outage).

Errors a user must fix (credentials, missing bucket, bad data) are raised at once;
connection-level failures are retried with capped exponential backoff and a log line
saying what we are waiting for, so a MinIO restart costs time, never data.

Transient or permanent is read from what each library says about a failure: its class
(botocore, obstore, deltalake, builtin connection errors), its HTTP status or error
code (botocore's response, object_store's "Server returned non-2xx status code: N"),
its errno (also as Rust's "(os error N)")
or its SQLSTATE (psycopg2). Only those structured parts of a message are read, never a
word anywhere in it: a file name holding "503" is not an outage.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import random
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TypeVar

from deltabus.core import metrics
from deltabus.core.errors import ConfigError, DeltabusError, exception_chain, user_storage_error
from deltabus.core.errors import StoppedDuringOutage as StoppedDuringOutage

T = TypeVar("T")
log = logging.getLogger(__name__)

# errno values of a network that failed on the way (the server may be back any moment).
NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED",
        "ECONNRESET",
        "ECONNABORTED",
        "ETIMEDOUT",
        "EHOSTUNREACH",
        "EHOSTDOWN",
        "ENETUNREACH",
        "ENETDOWN",
        "ENETRESET",
        "ENOTCONN",
        "EPIPE",
    )
    if hasattr(errno, name)
)
# S3 error codes that mean "try again" whatever their HTTP status (RequestTimeout is a 400).
S3_TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "XMinioServerNotInitialized",
    }
)
# SQLSTATEs of a PostgreSQL that went away or is starting, or of a transaction to rerun.
PG_TRANSIENT_CLASSES = ("08",)  # connection exception
PG_TRANSIENT_CODES = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01"})


def transient_status(status: int) -> bool:
    """True for an HTTP status an outage or overload explains: 5xx but 501, 505 and 507,
    and 408, 429 and 499 (a request the server dropped, as when it goes down)."""
    return status in (408, 429, 499) or (500 <= status <= 599 and status not in (501, 505, 507))


# delta-rs prints an error's chain one cause a line ("\n   ↳ cause"), colours the arrows,
# and splits messages at ": "; put it back on one line, as object_store wrote it.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CHAIN_ARROW = re.compile(r"\s*\n\s*↳\s*")
# Structured parts of object_store's messages (its RetryError and HttpError Display):
# "Error performing GET <url> in 1ms - Server returned non-2xx status code: 503 ...",
# "... - Server returned error response: <body>" (a 200 whose body says InternalError or
# SlowDown) and "... - HTTP error: error sending request" (no answer at all: connect,
# request, timeout, interrupted or unreadable body).
_OBJECT_STORE_STATUS = re.compile(
    r"(?:^|: |\s- )Server returned non-2xx status code: (\d{3})\b", re.M
)
_OBJECT_STORE_ERROR_BODY = re.compile(r"(?:^|: |\s- )Server returned error response: ", re.M)
_OBJECT_STORE_NO_ANSWER = re.compile(r"(?:^|: |\s- )HTTP error(?::|$)", re.M)
# reqwest's own message for a request that got no answer, as older object_store printed it.
_REQWEST_NO_ANSWER = re.compile(r"(?:^|: )error sending request for url \(", re.M)
# An errno as Rust ("(os error 111)") and Python ("[Errno 111]") print it.
_ERRNO = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
# libpq's messages for a server it cannot reach or that went away (psycopg2 gives no
# SQLSTATE for them): whole phrases, as libpq and strerror() write them.
_LIBPQ_GONE = re.compile(
    r"\b(?:Connection refused|Connection reset by peer|Connection timed out|"
    r"server closed the connection unexpectedly|could not receive data from server|"
    r"could not send data to server|no connection to the server|timeout expired|"
    r"SSL connection has been closed unexpectedly|sorry, too many clients already|"
    r"terminating connection due to administrator command|"
    r"the database system is (?:starting up|shutting down|in recovery mode|"
    r"not yet accepting connections))\b"
)


def one_line_chain(text: str) -> str:
    """An error message as its library wrote it: delta-rs' colours and one-cause-a-line
    layout undone."""
    return _CHAIN_ARROW.sub(": ", _ANSI.sub("", text))


def text_verdict(text: str) -> bool | None:
    """What the structured parts of a storage error's message say: True (an outage),
    False (a definite answer, e.g. 404), None (the message has none of them)."""
    text = one_line_chain(text)
    if (found := _OBJECT_STORE_STATUS.search(text)) is not None:
        return transient_status(int(found.group(1)))
    if _OBJECT_STORE_ERROR_BODY.search(text) or _OBJECT_STORE_NO_ANSWER.search(text):
        return True
    if _REQWEST_NO_ANSWER.search(text):
        return True
    if (found := _ERRNO.search(text)) is not None:
        return int(found.group(1) or found.group(2)) in NETWORK_ERRNOS or None
    return None


def _module(name: str) -> ModuleType | None:
    """A library's module when this process has loaded it (else none of its exceptions
    can be in hand, and nothing is imported to find out)."""
    return sys.modules.get(name)


def verdict(exc: BaseException) -> bool | None:
    """What one exception says of itself, by its class, status, code or SQLSTATE (its
    message only where its library puts nothing else there): True transient, False
    permanent, None when it says neither (a wrapper, say; its causes may)."""
    if isinstance(exc, DeltabusError):
        return False
    if (boto := _module("botocore.exceptions")) is not None:
        if isinstance(exc, boto.ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = exc.response.get("Error", {}).get("Code", "")
            return code in S3_TRANSIENT_CODES or transient_status(int(status))
        transient_boto = (
            boto.EndpointConnectionError,
            boto.ConnectionClosedError,
            boto.ConnectTimeoutError,
            boto.ReadTimeoutError,
            boto.ResponseStreamingError,
            boto.IncompleteReadError,
        )
        if isinstance(exc, transient_boto):
            return True
        if isinstance(exc, boto.BotoCoreError):
            return False  # no credentials, bad parameters, ...
    if (pg := _module("psycopg2")) is not None and isinstance(exc, pg.Error):
        code = getattr(exc, "pgcode", None)
        if code:
            return code.startswith(PG_TRANSIENT_CLASSES) or code in PG_TRANSIENT_CODES
        if isinstance(exc, pg.InterfaceError):
            return True  # the connection is closed
        if isinstance(exc, pg.OperationalError):
            return bool(_LIBPQ_GONE.search(str(exc)))
        return False
    if (obstore := _module("obstore.exceptions")) is not None and isinstance(
        exc, obstore.BaseError
    ):
        if isinstance(exc, obstore.GenericError):
            return text_verdict(str(exc))
        return False  # not found, exists, precondition, denied, bad path or config
    if (delta := _module("deltalake.exceptions")) is not None:
        permanent = (delta.TableNotFoundError, delta.DeltaProtocolError, delta.SchemaMismatchError)
        if isinstance(exc, permanent):
            return False
    if isinstance(exc, ConnectionError | TimeoutError | socket.gaierror):
        return True
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in NETWORK_ERRNOS
    return text_verdict(str(exc))


def is_transient(exc: BaseException) -> bool:
    """True for failures an outage explains (network, 5xx), not for ones a user must fix.

    The first exception of the chain (`exc`, then what it was raised from) that says
    either decides; a chain that says neither is permanent.
    """
    if user_storage_error(exc) is not None:
        return False  # read-only or full storage, access denied: waiting will not help
    for e in exception_chain(exc):
        found = verdict(e)
        if found is not None:
            return found
    return False


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
                metrics.RETRIES.labels(metrics.component(), "conflict").inc()
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
            metrics.RETRIES.labels(metrics.component(), "outage").inc()
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
