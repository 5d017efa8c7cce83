"""Commit events pushed by MinIO's webhook target, streamed on to every tailing process.

MinIO sends each bucket event to a webhook target as its own HTTP POST the moment the
object lands; its listen API (ListenBucketNotification) would be simpler but the pinned
MinIO holds that stream back (deltabus.bus.notify). One relay per store receives the POSTs
and keeps a streaming GET open per process, in the listen API's own format: one
`{"Records": [...]}` line per event and a `{"Records":null}` line every PING_S, each
flushed as written. `deltabus.bus.notify.CommitNotifier` reads it when DELTABUS_NOTIFY_URL
points here.

The stream is a hint: a process that loses it polls, and events the relay receives while
nobody listens are dropped (a listener that connects polls once first). Configure MinIO:

    MINIO_NOTIFY_WEBHOOK_ENABLE_DELTABUS=on
    MINIO_NOTIFY_WEBHOOK_ENDPOINT_DELTABUS=http://<relay>/minio

then `deltabus notify subscribe` adds the bucket's `.json` object-created events.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

PING_S = 1.0
PING_LINE = b'{"Records":null}\n'
MAX_EVENT_BYTES = 1 << 20  # one event is a few hundred bytes; anything bigger is refused
LISTENER_BACKLOG = 10_000  # events queued for one slow listener before it is dropped
WEBHOOK_TARGET_ID = "DELTABUS"  # MINIO_NOTIFY_WEBHOOK_*_<ID>; its queue ARN names it too


def queue_arn(region: str = "") -> str:
    """The ARN MinIO gives the webhook target, for a bucket notification configuration."""
    return f"arn:minio:sqs:{region}:{WEBHOOK_TARGET_ID}:webhook"


class _Listener:
    def __init__(self) -> None:
        self.lines: queue.Queue[bytes] = queue.Queue(LISTENER_BACKLOG)
        self.dropped = False


class NotifyRelay:
    """A threaded HTTP server: POST (from MinIO) fans out to every GET stream."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        self.token = token
        self._listeners: set[_Listener] = set()
        self._lock = threading.Lock()
        self.received = 0
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}"

    @property
    def listeners(self) -> int:
        with self._lock:
            return len(self._listeners)

    def start(self) -> NotifyRelay:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="notify-relay", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for listener in self._listeners:
                listener.dropped = True

    def __enter__(self) -> NotifyRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def publish(self, event: dict) -> None:
        """Send one webhook event's records to every listener."""
        line = json.dumps({"Records": event.get("Records") or []}, separators=(",", ":"))
        data = line.encode() + b"\n"
        with self._lock:
            self.received += 1
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener.lines.put_nowait(data)
            except queue.Full:  # a stalled reader: drop it, it reconnects and polls
                listener.dropped = True

    def _add(self) -> _Listener:
        listener = _Listener()
        with self._lock:
            self._listeners.add(listener)
        return listener

    def _remove(self, listener: _Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)


def _handler(relay: NotifyRelay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # MinIO's client keeps its connection for the next POST

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            if relay.token and self.headers.get("Authorization") != f"Bearer {relay.token}":
                self._answer(HTTPStatus.UNAUTHORIZED)
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_EVENT_BYTES:
                self._answer(HTTPStatus.BAD_REQUEST)
                return
            try:
                event = json.loads(self.rfile.read(length))
            except ValueError:
                self._answer(HTTPStatus.BAD_REQUEST)
                return
            self._answer(HTTPStatus.OK)
            if isinstance(event, dict):
                relay.publish(event)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?")[0].rstrip("/") not in ("", "/events"):
                self._answer(HTTPStatus.NOT_FOUND)
                return
            listener = relay._add()
            try:
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                self.wfile.write(PING_LINE)  # the headers and a first line, at once
                self.wfile.flush()
                while not listener.dropped:
                    try:
                        line = listener.lines.get(timeout=PING_S)
                    except queue.Empty:
                        line = PING_LINE
                    self.wfile.write(line)
                    self.wfile.flush()
            except OSError:  # the listener went away
                pass
            finally:
                relay._remove(listener)

        def _answer(self, status: HTTPStatus) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("relay: " + format, *args)

    return Handler


def subscribe(lake: Lake, region: str = "") -> str:
    """Ask the lake's MinIO to send the lake's commit events (`.json` objects created under
    the prefix) to the relay's webhook target; returns the target's ARN.

    Replaces the bucket's notification configuration (S3 keeps one per bucket). MinIO
    refuses an ARN it has no target for: then the server lacks the
    MINIO_NOTIFY_WEBHOOK_*_DELTABUS settings.
    """
    from deltabus.core.errors import StorageError

    s = lake.settings
    prefix = s.prefix.strip("/")
    rules = [{"Name": "suffix", "Value": ".json"}]
    if prefix:
        rules.insert(0, {"Name": "prefix", "Value": f"{prefix}/"})
    arn = queue_arn(region)
    config = {
        "QueueConfigurations": [
            {
                "Id": "deltabus-commits",
                "QueueArn": arn,
                "Events": ["s3:ObjectCreated:*"],
                "Filter": {"Key": {"FilterRules": rules}},
            }
        ]
    }
    from botocore.exceptions import ClientError

    client = lake.s3_client()
    try:
        client.put_bucket_notification_configuration(
            Bucket=s.bucket, NotificationConfiguration=config
        )
    except ClientError as exc:
        # The one InvalidArgument this request can get: the queue ARN names no target.
        if exc.response.get("Error", {}).get("Code") == "InvalidArgument":
            raise StorageError(
                f"MinIO at {s.minio_endpoint} has no webhook target {WEBHOOK_TARGET_ID}",
                f"start it with MINIO_NOTIFY_WEBHOOK_ENABLE_{WEBHOOK_TARGET_ID}=on and "
                f"MINIO_NOTIFY_WEBHOOK_ENDPOINT_{WEBHOOK_TARGET_ID}=http://<relay>/minio",
            ) from None
        raise
    return arn
