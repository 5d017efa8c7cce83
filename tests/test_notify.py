"""Commit notifications wake tails promptly; a store that cannot stream them means polling.

Against the session's real MinIO: requests are signed and accepted, wrong credentials are
refused quietly, and commits wake the right watch within 0.5 s when that MinIO build
flushes its stream; builds that never flush it (a regression in MinIO's S3 response
wrapper) must be caught and left for polling. A small stand-in server that speaks the
listen protocol over a real socket checks the client's side either way: events are read
line by line as they arrive, drops force wakes, batched streams are refused.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import obstore
import pytest
from pydantic import SecretStr

from deltabus.bus.notify import CommitNotifier, CommitWatch, notifier_for
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake

WAKE_LIMIT_S = 0.5
BATCHED = "holds events back"


def commit_key(table: str, version: int) -> str:
    return f"{table}/_delta_log/{version:020d}.json"


def wait_until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def drain(watch: CommitWatch) -> None:
    """Consume the wake a (re)connect forces, so the next wake is an event's."""
    watch.wait(0)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- the real MinIO ----------------------------------------------------------------------


def put_and_wait(lake: Lake, watch: CommitWatch, key: str) -> float:
    start = time.monotonic()
    obstore.put(lake.object_store, key, b"{}")
    assert watch.wait(2.0), f"no wake for {key}"
    return time.monotonic() - start


@pytest.fixture
def notifier(minio_lake: Lake) -> Iterator[CommitNotifier]:
    n = CommitNotifier(minio_lake)
    yield n
    n.close()


@pytest.fixture(scope="module")
def minio_streams(minio: object, tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Whether this MinIO build flushes the listen stream (its ping arrives within 1 s)."""
    from tests.conftest import minio_settings_for

    n = CommitNotifier(Lake(minio_settings_for(minio, "probe-streaming")))  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 2.5
        while not n.healthy and time.monotonic() < deadline:
            time.sleep(0.02)
        return n.healthy
    finally:
        n.close()


def test_commit_wakes_its_table_only(
    minio_lake: Lake,
    notifier: CommitNotifier,
    minio_streams: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if not minio_streams:
        pytest.xfail("this MinIO build never flushes ListenBucketNotification (tails poll)")
    caplog.set_level(logging.DEBUG, logger="deltabus.bus.notify")
    t1, t2 = notifier.watch("t1"), notifier.watch("t2")
    assert t1.latest == -1
    wait_until(lambda: notifier.healthy, 5, "a healthy stream")
    drain(t1)
    drain(t2)

    assert put_and_wait(minio_lake, t1, commit_key("t1", 3)) < WAKE_LIMIT_S
    assert t1.latest == 3

    # Data files, other .json files and another table's commits neither wake t1 nor move
    # its latest; t2's wake shows those events had been delivered by then.
    store = minio_lake.object_store
    obstore.put(store, "t1/part-0.parquet", b"x")
    obstore.put(store, "t1/_delta_log/00000000000000000004.crc.json", b"{}")
    obstore.put(store, "t1/notes.json", b"{}")
    obstore.put(store, commit_key("t1x", 9), b"{}")
    assert put_and_wait(minio_lake, t2, commit_key("t2", 7)) < WAKE_LIMIT_S
    assert t2.latest == 7
    assert not t1.wait(0.3)
    assert t1.latest == 3
    assert notifier.watch("t1").latest == 3  # a new watch starts from what was seen

    # Sequential commits each wake within the limit: events are read as they arrive.
    latencies = [put_and_wait(minio_lake, t1, commit_key("t1", v)) for v in range(4, 12)]
    assert t1.latest == 11
    assert max(latencies) < WAKE_LIMIT_S, latencies
    print(f"MinIO wake latency ms (PUT included): {[round(x * 1000, 1) for x in latencies]}")
    assert notifier.healthy
    assert minio_lake.settings.secret_key.get_secret_value() not in caplog.text


def test_store_that_batches_events_is_left_for_polling(
    minio_lake: Lake,
    notifier: CommitNotifier,
    minio_streams: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if minio_streams:
        pytest.skip("this MinIO build flushes its stream")
    watch = notifier.watch("t1")
    healthy_samples = []
    deadline = time.monotonic() + 8
    version = 0
    while BATCHED not in " ".join(warnings_of(caplog)):
        assert time.monotonic() < deadline, f"batching not detected: {warnings_of(caplog)}"
        obstore.put(minio_lake.object_store, commit_key("t1", version), b"{}")
        version += 1
        for _ in range(40):
            healthy_samples.append(notifier.healthy)
            time.sleep(0.01)
    assert watch.wait(0)  # woken so its tail polls
    assert sum(healthy_samples) <= len(healthy_samples) // 20, "reported healthy while late"
    time.sleep(0.3)
    assert not notifier.healthy


def test_no_notifier_for_local_storage_or_unless_enabled(
    local_lake: Lake, minio_lake: Lake
) -> None:
    assert notifier_for(local_lake) is None
    assert not minio_lake.settings.notify  # off by default
    assert notifier_for(minio_lake) is None
    on = Lake(minio_lake.settings.model_copy(update={"notify": True}))
    shared = notifier_for(on)
    assert shared is not None
    try:
        assert notifier_for(Lake(on.settings)) is shared
    finally:
        shared.close()
    replaced = notifier_for(on)  # a closed one is replaced
    assert replaced is not None and replaced is not shared
    replaced.close()


def test_close_ends_the_thread(notifier: CommitNotifier) -> None:
    time.sleep(0.5)  # blocked on the open request, whether or not it has answered yet
    start = time.monotonic()
    notifier.close()
    assert not notifier._thread.is_alive()
    assert time.monotonic() - start < 3.0
    assert not notifier.healthy


def test_wrong_credentials_are_unhealthy_and_quiet(
    minio_lake: Lake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="deltabus.bus.notify")
    secret = "wrong-secret-Zq8xV3"
    settings = minio_lake.settings.model_copy(update={"secret_key": SecretStr(secret)})
    notifier = CommitNotifier(Lake(settings))
    watch = notifier.watch("t1")
    try:
        wait_until(lambda: warnings_of(caplog), 5, "a warning about the refused request")
        assert not notifier.healthy
        assert watch.wait(1.0)  # refused: every wake is forced, latest stays
        assert watch.latest == -1
        time.sleep(0.7)  # a few retries: still one warning
    finally:
        notifier.close()
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)
    assert "403" in warnings_of(caplog)[0]
    assert secret not in caplog.text


# -- the client's side, against a stand-in listen server -----------------------------------

PING = b'{"Records":null}\n'


def event_line(key: str, at: float | None = None) -> bytes:
    """One event as MinIO writes it (trimmed to the fields a reader may use)."""
    stamp = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    record = {
        "eventVersion": "2.0",
        "eventSource": "minio:s3",
        "eventTime": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "eventName": "s3:ObjectCreated:Put",
        "s3": {"bucket": {"name": "deltabus-test"}, "object": {"key": key, "size": 2}},
    }
    return json.dumps({"Records": [record]}, separators=(",", ":")).encode() + b"\n"


class ListenServer:
    """Answers the listen request like MinIO: a chunked stream, each line flushed at once.

    `batch` > 1 holds lines back and sends them together, as MinIO builds that never
    flush do; `status` other than 200 refuses the request. Each connection's lines are
    fed through the queue `next_stream()` returns; None drops the connection.
    """

    def __init__(self, status: int = 200, batch: int = 1) -> None:
        self.status, self.batch = status, batch
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.streams: queue.Queue[queue.Queue[bytes | None]] = queue.Queue()
        self.closing = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def next_stream(self) -> queue.Queue[bytes | None]:
        return self.streams.get(timeout=5)

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append((self.path, dict(self.headers)))
                if server.status != 200:
                    body = b"<Error><Code>NotImplemented</Code></Error>"
                    self.send_response(server.status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                lines: queue.Queue[bytes | None] = queue.Queue()
                server.streams.put(lines)
                held = b""
                while not server.closing.is_set():
                    try:
                        line = lines.get(timeout=0.5)
                    except queue.Empty:
                        line = PING if server.batch == 1 else b""
                    if line is None:
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    held += line
                    if held and (server.batch == 1 or held.count(b"\n") >= server.batch):
                        try:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(held), held))
                        except OSError:
                            return
                        held = b""

        return Handler


@pytest.fixture
def listen_server() -> Iterator[ListenServer]:
    server = ListenServer()
    yield server
    server.close()


def lake_at(server: ListenServer, secret: str = "stand-in-secret-Kx81") -> Lake:
    return Lake(
        Settings(
            storage="minio",
            minio_endpoint=server.endpoint,
            access_key="stand-in-key",
            secret_key=secret,
            bucket="deltabus-test",
            prefix="lake/bench/x",
        )
    )


def test_events_are_read_line_by_line(listen_server: ListenServer) -> None:
    notifier = CommitNotifier(lake_at(listen_server))
    try:
        stream = listen_server.next_stream()
        t1, t2 = notifier.watch("t1"), notifier.watch("t2")
        wait_until(lambda: notifier.healthy, 2, "a healthy stream")
        drain(t1)
        drain(t2)

        path, headers = listen_server.requests[0]
        assert path.startswith("/deltabus-test?")
        for part in ("events=s3%3AObjectCreated%3A%2A", "prefix=lake%2Fbench%2Fx%2F", "ping=1"):
            assert part in path
        assert "suffix=.json" in path
        assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=stand-in-key/")
        assert "X-Amz-Content-SHA256" in headers and "X-Amz-Date" in headers

        # Not commits of t1: another table, another prefix, other .json files.
        for key in (
            "lake/bench/x/t2/_delta_log/00000000000000000005.json",
            "lake/bench/y/t1/_delta_log/00000000000000000006.json",
            "lake/bench/x/t1/_delta_log/_last_checkpoint.json",
            "lake/bench/x/t1/_delta_log/00000000000000000007.checkpoint.json",
            "lake/bench/x/t1x/_delta_log/00000000000000000008.json",
        ):
            stream.put(event_line(key))
        assert t2.wait(1) and t2.latest == 5
        assert not t1.wait(0.2)
        assert t1.latest == -1

        # Each event wakes on its own: nothing waits for more bytes to arrive.
        latencies = []
        for version in range(1, 9):
            key = f"lake/bench/x/t1/_delta_log/{version:020d}.json"
            if version == 8:
                key = key.replace("/", "%2F")  # URL-encoded keys as other stores send them
            start = time.monotonic()
            stream.put(event_line(key))
            assert t1.wait(1), version
            latencies.append(time.monotonic() - start)
            assert t1.latest == version
        print(f"stand-in wake latency ms: {[round(x * 1000, 2) for x in latencies]}")
        assert max(latencies) < WAKE_LIMIT_S / 5, latencies
        assert notifier.healthy
    finally:
        notifier.close()


def test_dropped_stream_forces_wake_and_reconnects(listen_server: ListenServer) -> None:
    notifier = CommitNotifier(lake_at(listen_server))
    try:
        stream = listen_server.next_stream()
        watch = notifier.watch("t1")
        wait_until(lambda: notifier.healthy, 2, "a healthy stream")
        drain(watch)
        stream.put(event_line("lake/bench/x/t1/_delta_log/00000000000000000001.json"))
        assert watch.wait(1) and watch.latest == 1

        stream.put(None)  # the connection drops
        assert watch.wait(1)  # forced: the tail must poll
        assert watch.latest == 1
        stream = listen_server.next_stream()  # it reconnects
        wait_until(lambda: notifier.healthy, 2, "a healthy stream again")
        assert watch.wait(1)  # forced again: events between drop and reconnect were missed
        assert watch.latest == 1
        stream.put(event_line("lake/bench/x/t1/_delta_log/00000000000000000002.json"))
        assert watch.wait(1) and watch.latest == 2
        assert len(listen_server.requests) == 2
    finally:
        notifier.close()
    assert not notifier._thread.is_alive()


def test_batched_stream_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    server = ListenServer(batch=3)
    notifier = CommitNotifier(lake_at(server))
    try:
        stream = server.next_stream()
        watch = notifier.watch("t1")
        now = time.time()
        for version, age in ((1, 1.2), (2, 0.6), (3, 0.0)):
            key = f"lake/bench/x/t1/_delta_log/{version:020d}.json"
            stream.put(event_line(key, at=now - age))
        wait_until(lambda: warnings_of(caplog), 3, "a warning about batching")
        assert BATCHED in warnings_of(caplog)[0]
        assert watch.wait(0) and not notifier.healthy
    finally:
        notifier.close()
        server.close()


def test_store_without_the_extension(caplog: pytest.LogCaptureFixture) -> None:
    server = ListenServer(status=501)
    secret = "stand-in-secret-Pw93"
    notifier = CommitNotifier(lake_at(server, secret))
    try:
        wait_until(lambda: len(server.requests) >= 3, 5, "retries")
        assert not notifier.healthy
    finally:
        notifier.close()
        server.close()
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)
    assert "501 NotImplemented" in warnings_of(caplog)[0]
    assert secret not in caplog.text
