"""Store profiles: the proxies in front of a real MinIO deliver each profile's per-request
distribution, and the tail stage delays whole requests, one draw each.

The bands are properties of the injected distributions (MinIO on loopback adds about a
millisecond), not timings of deltabus' code; upper bounds of tails are not asserted, as a
busy shared machine only adds to them.
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.core.errors import ConfigError
from deltabus.core.net import free_port
from deltabus.delta.lake import Lake
from deltabus_bench.latency_proxy import DelayStage, SlowRequests
from deltabus_bench.store_check import measure
from deltabus_bench.store_profiles import PROFILES, StoreProxy, profile
from tests.conftest import minio_settings_for

REQUESTS = 250  # per request class


def test_profiles_model_the_documented_distributions() -> None:
    """The modelled injected delay: s3-standard's median in the tens of ms with a p99 of
    100-300 ms; s3-express's within single-digit ms; loopback has no proxy."""
    standard = PROFILES["s3-standard"].modelled_ms()
    assert 20 <= standard["p50"] <= 30 and 100 <= standard["p99"] <= 300, standard
    assert standard["max"] <= 2000, standard  # AWS: retry a request unanswered after 2 s
    express = PROFILES["s3-express"].modelled_ms()
    assert 2 <= express["p50"] and express["max"] <= 5, express
    assert not PROFILES["loopback"].proxied
    assert profile(" S3-Standard ") is PROFILES["s3-standard"]
    with pytest.raises(ConfigError, match="s3-express"):
        profile("s3-glacier")


def test_tail_draws_are_per_request() -> None:
    """About `probability` of the draws are delays, each from the log-normal, capped."""
    tail = SlowRequests(probability=0.05, median_ms=100, sigma=0.5, max_ms=300)
    rng = random.Random(1)
    draws = [tail.sample_ms(rng) for _ in range(20_000)]
    slow = sorted(d for d in draws if d > 0)
    assert 0.04 <= len(slow) / len(draws) <= 0.06
    assert 85 <= slow[len(slow) // 2] <= 115 and max(slow) == 300


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every request with its method and the body it received."""

    protocol_version = "HTTP/1.1"
    bodies: list[bytes] = []

    def _answer(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.bodies.append(body)
        out = self.command.encode() + b" " + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_PUT = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tail_stage() -> Iterator[tuple[int, DelayStage]]:
    """A tail stage delaying every request by exactly 30 ms, in front of `_Echo`."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    stage = DelayStage(
        SlowRequests(1.0, 30, 0.0), ("127.0.0.1", upstream.server_address[1]), seed=0
    )
    port = free_port()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(stage.serve(port, stop),))
    thread.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            break
        except OSError:
            time.sleep(0.02)
    try:
        yield port, stage
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
        upstream.shutdown()


def test_tail_stage_delays_each_request_on_a_kept_alive_connection(
    tail_stage: tuple[int, DelayStage],
) -> None:
    """Three requests on one connection (no body, a Content-Length body, a chunked body):
    each waits its own delay, and every body arrives whole."""
    port, stage = tail_stage
    _Echo.bodies = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    answers, waited = [], []
    for method, body, chunked in (
        ("GET", None, False),
        ("PUT", b"x" * 100_000, False),
        ("POST", iter([b"abc", b"de" * 5000]), True),
    ):
        t0 = time.perf_counter()
        conn.request(method, "/o", body=body, encode_chunked=chunked)
        answers.append(conn.getresponse().read())
        waited.append(time.perf_counter() - t0)
    conn.close()
    assert answers == [b"GET ", b"PUT " + b"x" * 100_000, b"POST abc" + b"de" * 5000]
    assert _Echo.bodies == [b"", b"x" * 100_000, b"abc" + b"de" * 5000]
    assert all(w >= 0.03 for w in waited), waited
    assert (stage.requests, stage.delayed) == (3, 3)


def _through(minio: MinioServer, proxy: StoreProxy):
    return minio_settings_for(minio, f"store-{uuid.uuid4().hex[:8]}").model_copy(
        update={"minio_endpoint": proxy.endpoint}
    )


def test_s3_standard_profile_through_minio(
    minio: MinioServer, toxiproxy: Path, tmp_path: Path
) -> None:
    """GETs and PUTs through the s3-standard proxies with obstore: medians of 20-40 ms and
    p99s of at least 80 ms over 250 requests each; the tail stage counted every request
    once; boto3 (deltabus' bootstrap client) works through it too."""
    proxy = StoreProxy(PROFILES["s3-standard"], minio.endpoint, tmp_path, seed=3, binary=toxiproxy)
    with proxy:
        settings = _through(minio, proxy)
        result = measure(settings, REQUESTS, classes=("GET", "PUT"))
        client = Lake(settings).s3_client()
        client.put_object(Bucket=settings.bucket, Key=f"{settings.prefix}/boto", Body=b"b" * 5000)
        got = client.get_object(Bucket=settings.bucket, Key=f"{settings.prefix}/boto")
        assert got["Body"].read() == b"b" * 5000
    for name, stats in result.items():
        assert stats["n"] == REQUESTS
        assert 20 <= stats["p50"] <= 40, (name, result)
        assert stats["p99"] >= 80, (name, result)
    assert proxy.tail_counts is not None
    # measure's 4 setup PUTs, its requests and boto3's two
    assert proxy.tail_counts["requests"] == 4 + 2 * REQUESTS + 2, proxy.tail_counts
    assert 0 < proxy.tail_counts["delayed"] < 0.1 * proxy.tail_counts["requests"]
    assert proxy.endpoint == minio.endpoint and proxy.pids == {}  # stopped


def test_s3_express_profile_through_minio(
    minio: MinioServer, toxiproxy: Path, tmp_path: Path
) -> None:
    """GETs through the s3-express proxy: a median of single-digit milliseconds, above
    the injected 2 ms."""
    with StoreProxy(
        PROFILES["s3-express"], minio.endpoint, tmp_path, seed=3, binary=toxiproxy
    ) as proxy:
        assert set(proxy.pids) == {"toxiproxy"}  # no tail: no tail stage
        result = measure(_through(minio, proxy), REQUESTS, classes=("GET",))
    assert 2 <= result["GET"]["p50"] <= 9, result


def test_a_proxied_profile_needs_plain_http(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plain http"):
        StoreProxy(PROFILES["s3-standard"], "https://s3.example.com", tmp_path)
    loopback = StoreProxy(PROFILES["loopback"], "https://s3.example.com", tmp_path).start()
    assert loopback.endpoint == "https://s3.example.com" and loopback.pids == {}
