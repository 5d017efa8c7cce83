"""Wake Delta log tails when a commit lands, instead of polling every 20 ms.

MinIO streams bucket events to a client that keeps one GET open (the ListenBucketNotification
S3 extension). One such request per process, filtered to the lake prefix and `.json` keys,
tells every tail in the process which table got which commit version. The stream is a hint,
never the truth: when it drops, every watch is woken so its tail polls (events may have been
missed), and stores without the extension (plain S3, local disk) keep polling.

A stream that delivers events late is worse than none, since tails would wait on it. Some
MinIO builds never flush the stream (the `trackingResponseWriter` that wraps every S3
response lacks `Flush`, minio PR #21651), so events arrive only once ~4 KB have queued up.
Such a stream never counts as healthy: without traffic no ping arrives within
`READ_TIMEOUT_S` (reconnect), and with traffic events arrive together although MinIO
stamped them apart (`HELD_BACK_S`; retried like a refusal, every 30 s at most).

A tail waits like this: poll the next version; when it is missing and the notifier is
`healthy`, `watch.wait(timeout)` (a short timeout still bounds the delay of a missed event),
otherwise sleep the usual poll interval.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import threading
import time
import weakref
from collections import deque
from datetime import datetime
from urllib.parse import quote, unquote_plus, urlencode, urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

# Seconds between the server's keep-alive lines (`{"Records":null}`); it also flushes the
# response headers, so a (re)connected stream is healthy after at most this long.
PING_S = 1
# No bytes for this long means the connection is dead or the store holds the stream back.
READ_TIMEOUT_S = PING_S + 2.0
# Two events from one MinIO node, received within HELD_WINDOW_S, whose delays differ by more
# than this: the store batches events (only differences of delay on one node's clock count).
HELD_BACK_S = 0.5
HELD_WINDOW_S = 5.0
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 5.0
# Stores that refuse the request (501 without the extension, 403) are asked again rarely.
REFUSED_BACKOFF_MAX_S = 30.0
COMMIT_KEY = re.compile(r"(?P<table>.+)/_delta_log/(?P<version>\d{20})\.json")


class CommitWatch:
    """What one tail waits on: the highest commit version notified for one table."""

    def __init__(self, latest: int = -1) -> None:
        self.latest = latest
        self._cond = threading.Condition()
        self._pending = False  # a wake not yet consumed by `wait`, so none is ever lost

    def wait(self, timeout: float) -> bool:
        """True when woken (a new notification, or a forced wake) before `timeout` seconds."""
        with self._cond:
            woke = self._cond.wait_for(lambda: self._pending, timeout)
            self._pending = False
            return woke

    def _wake(self, version: int | None = None) -> None:
        """Raise `latest` to `version` (None: a forced wake, the tail must poll) and wake."""
        with self._cond:
            if version is not None and version > self.latest:
                self.latest = version
            self._pending = True
            self._cond.notify_all()


class _Unusable(Exception):
    """The store refused the listen request, or delivers its events late."""


class CommitNotifier:
    """One long-lived ListenBucketNotification request per process for the lake prefix."""

    def __init__(self, lake: Lake) -> None:
        s = lake.settings
        # The relay of MinIO's webhook events (deltabus.bus.notify_relay), or MinIO itself.
        self._relay = urlsplit(s.notify_url) if s.notify_url else None
        self._url = self._relay or urlsplit(s.minio_endpoint)
        self._bucket = s.bucket
        self._access = lake.access
        prefix = s.prefix.strip("/")
        self._key_prefix = f"{prefix}/" if prefix else ""
        self._watches: dict[str, weakref.WeakSet[CommitWatch]] = {}
        self._latest: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._healthy = False
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="deltabus-notify", daemon=True)
        self._thread.start()

    def watch(self, table: str) -> CommitWatch:
        """A new watch for `table` (one per tail: each consumes its own wakes)."""
        with self._lock:
            watch = CommitWatch(self._latest.get(table, -1))
            self._watches.setdefault(table, weakref.WeakSet()).add(watch)
            return watch

    @property
    def healthy(self) -> bool:
        """True while the stream is connected and has delivered its first bytes."""
        return self._healthy

    @property
    def closed(self) -> bool:
        """Closed, or its thread is gone (as in a forked child): `notifier_for` replaces it."""
        return self._stop.is_set() or not self._thread.is_alive()

    def close(self, timeout: float = 3.0) -> None:
        """Stop the thread: shutting the socket down ends a blocked read at once."""
        with self._lock:
            self._stop.set()
            conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- the stream thread ---------------------------------------------------------------

    def _run(self) -> None:
        delay = BACKOFF_MIN_S
        while not self._stop.is_set():
            cap = BACKOFF_MAX_S
            try:
                self._listen()
                problem = "the stream ended"
            except _Unusable as exc:
                problem, cap = str(exc), REFUSED_BACKOFF_MAX_S
            except TimeoutError:
                problem = f"no ping or event within {READ_TIMEOUT_S:g}s"
            except Exception as exc:  # any failure falls back to polling, never raises
                problem = f"{type(exc).__name__}: {exc}"
            was_healthy, self._healthy = self._healthy, False
            if was_healthy and cap == BACKOFF_MAX_S:
                delay = BACKOFF_MIN_S
            self._wake_all()  # events may have been missed: every tail must poll
            if self._stop.is_set():
                break
            # One warning per kind of problem: a store that refuses or batches is retried
            # every 30 s for the life of the process.
            level = logging.DEBUG if problem in self._warned else logging.WARNING
            self._warned.add(problem)
            log.log(
                level,
                "commit notifications from %s unavailable (%s); tails poll, retrying in %.1fs",
                self._url.netloc,
                problem,
                min(delay, cap),
            )
            self._stop.wait(min(delay, cap))
            delay = min(delay * 2, cap)

    def _listen(self) -> None:
        """Hold one listen request open and dispatch its events until it ends or fails."""
        conn_type = (
            http.client.HTTPSConnection
            if self._url.scheme == "https"
            else http.client.HTTPConnection
        )
        conn = conn_type(self._url.netloc, timeout=READ_TIMEOUT_S)
        try:
            conn.connect()
            with self._lock:  # close() either sees this connection or we see its stop
                if self._stop.is_set():
                    return
                self._conn = conn
            if self._relay is not None:
                path, headers = self._relay.path or "/events", {"Host": self._relay.netloc}
            else:
                path, headers = self._signed_request()
            conn.request("GET", path, headers=headers)
            # MinIO subscribes before it sends anything and flushes the headers with the
            # first ping or event, so a response here means nothing from now on is missed.
            response = conn.getresponse()
            if response.status != 200:
                raise _Unusable(_error_text(response))
            self._healthy = True
            log.debug("commit notifications from %s connected", self._url.netloc)
            self._wake_all()  # events between a drop and this reconnect were missed
            delays: deque[tuple[float, str, float]] = deque()  # received, node, delay
            while not self._stop.is_set():
                # One line per event as it arrives; read(n) would wait for n bytes.
                line = response.readline()
                if not line:
                    return
                received = time.monotonic()
                stamp = self._dispatch(line) if line.strip() else None
                if stamp is None:
                    continue
                node, stamped = stamp
                delays.append((received, node, time.time() - stamped))
                while delays[0][0] < received - HELD_WINDOW_S:
                    delays.popleft()
                same_node = [d for _, n, d in delays if n == node]
                spread = max(same_node) - min(same_node)
                if spread > HELD_BACK_S:
                    log.debug("events held back up to %.1fs", spread)
                    raise _Unusable("the store holds events back and sends them in batches")
        finally:
            with self._lock:
                self._conn = None
            conn.close()

    def _signed_request(self) -> tuple[str, dict[str, str]]:
        """Path and SigV4 headers of the listen request (signed anew for every connect)."""
        query = {"events": "s3:ObjectCreated:*", "suffix": ".json", "ping": str(PING_S)}
        if self._key_prefix:
            query["prefix"] = self._key_prefix
        path = f"/{self._bucket}?{urlencode(query, quote_via=quote, safe='')}"
        request = AWSRequest(
            method="GET",
            url=f"{self._url.scheme}://{self._url.netloc}{path}",
            headers={"Host": self._url.netloc},
        )
        keys = self._access.keys()  # the current ones: temporary keys are refreshed
        credentials = Credentials(keys.access_key, keys.secret_key, keys.token)
        S3SigV4Auth(credentials, "s3", self._access.region).add_auth(request)
        return path, {k: str(v) for k, v in request.headers.items()}

    def _dispatch(self, line: bytes) -> tuple[str, float] | None:
        """Wake the watches of every table a commit in this event line landed in.

        Returns which MinIO node stamped its last event and when; None for pings.
        """
        try:
            records = json.loads(line).get("Records") or []
        except (ValueError, AttributeError):
            log.debug("ignored an unreadable notification line")
            return None
        stamp = None
        for record in records:
            try:
                at = datetime.fromisoformat(record["eventTime"]).timestamp()
                node = (record.get("responseElements") or {}).get("x-minio-origin-endpoint")
                stamp = (str(node), at)
            except (KeyError, TypeError, ValueError, AttributeError):
                pass
            try:
                key = str(record["s3"]["object"]["key"])
                bucket = record["s3"].get("bucket", {}).get("name", self._bucket)
            except (KeyError, TypeError, AttributeError):
                continue
            if bucket != self._bucket:  # a relay carries every bucket's events
                continue
            match = self._commit(key) or self._commit(unquote_plus(key))
            if match is None:
                continue
            table, version = match["table"], int(match["version"])
            with self._lock:
                if version > self._latest.get(table, -1):
                    self._latest[table] = version
                watches = list(self._watches.get(table, ()))
            for watch in watches:
                watch._wake(version)
        return stamp

    def _commit(self, key: str) -> re.Match[str] | None:
        """Table and version of a commit key (MinIO sends keys raw; others URL-encode)."""
        if not key.startswith(self._key_prefix):
            return None
        return COMMIT_KEY.fullmatch(key[len(self._key_prefix) :])

    def _wake_all(self) -> None:
        with self._lock:
            watches = [w for group in self._watches.values() for w in group]
        for watch in watches:
            watch._wake()


def _error_text(response: http.client.HTTPResponse) -> str:
    """The status and S3 error code of a refused request (the body holds no secrets)."""
    body = response.read(4096).decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]*)</Code>", body)
    return f"HTTP {response.status}" + (f" {code[1]}" if code else f" {response.reason}")


_shared: dict[tuple[str, str, str], CommitNotifier] = {}
_shared_lock = threading.Lock()


def notifier_for(lake: Lake) -> CommitNotifier | None:
    """The process's notifier for this lake; None where tails must simply poll.

    None for local storage or AWS S3 (neither streams commit events), or when
    DELTABUS_NOTIFY is false. A notifier whose thread is gone (closed, or inherited
    through fork) is replaced.
    """
    if lake.is_local or lake.settings.endpoint is None:
        return None
    if not lake.settings.notify:
        return None
    s = lake.settings
    key = (s.minio_endpoint, s.bucket, s.prefix.strip("/"))
    with _shared_lock:
        notifier = _shared.get(key)
        if notifier is None or notifier.closed:
            notifier = _shared[key] = CommitNotifier(lake)
        return notifier


def close_all() -> None:
    """Close every notifier of this process (a benchmark before it stops its relay)."""
    with _shared_lock:
        notifiers = list(_shared.values())
        _shared.clear()
    for notifier in notifiers:
        notifier.close()
