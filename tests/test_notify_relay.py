"""Commit events pushed by MinIO's webhook target through the relay wake tails at once.

A real MinIO started with the DELTABUS webhook target posts to a real relay; the
notifier reads the relay's stream as it reads MinIO's listen API. The relay's own HTTP
contract (token, malformed bodies, fan-out, pings) is checked over real sockets.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import obstore
import psutil
import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.bus.notify import CommitNotifier
from deltabus.bus.notify_relay import PING_LINE, NotifyRelay, subscribe
from deltabus.core.errors import StorageError
from deltabus.core.net import free_port
from deltabus.core.processes import LAKE_ENV_PREFIXES
from deltabus.core.settings import Settings, load_settings
from deltabus.delta.lake import Lake
from tests.conftest import minio_settings_for, run_cli
from tests.helpers import dev_minio_cli
from tests.test_notify import commit_key, drain, put_and_wait, wait_until

WAKE_LIMIT_S = 0.5


@pytest.fixture(scope="module")
def relay() -> Iterator[NotifyRelay]:
    with NotifyRelay() as r:
        yield r


@pytest.fixture(scope="module")
def pushing_minio(
    minio: MinioServer, relay: NotifyRelay, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MinioServer]:
    """A MinIO whose webhook target DELTABUS posts to the relay (the session's binary)."""
    server = MinioServer(
        tmp_path_factory.mktemp("minio-push") / "data",
        access_key="push-" + secrets.token_hex(4),
        secret_key=secrets.token_urlsafe(18),
        binary=minio.binary,
        webhook=f"{relay.url}/minio",
    )
    server.start()
    yield server
    server.stop()


def settings_for(server: MinioServer, relay: NotifyRelay, bucket: str, prefix: str) -> Settings:
    return minio_settings_for(
        server, prefix, bucket=bucket, notify=True, notify_url=f"{relay.url}/events"
    )


def test_commits_pushed_through_the_relay_wake_their_table_only(
    pushing_minio: MinioServer, relay: NotifyRelay
) -> None:
    lake = Lake(settings_for(pushing_minio, relay, "pushed", "lake"))
    other = Lake(settings_for(pushing_minio, relay, "pushed-other", "lake"))
    outside = Lake(settings_for(pushing_minio, relay, "pushed", "elsewhere"))
    for lk in (lake, other):
        lk.init_bucket()
        assert subscribe(lk).endswith(":DELTABUS:webhook")
    notifier = CommitNotifier(lake)
    try:
        t1, t2 = notifier.watch("t1"), notifier.watch("t2")
        wait_until(lambda: notifier.healthy, 5, "the relay's stream")
        drain(t1)
        drain(t2)
        latencies = [put_and_wait(lake, t1, commit_key("t1", v)) for v in range(8)]
        assert t1.latest == 7
        assert max(latencies) < WAKE_LIMIT_S, latencies
        # Data files, another table, the same table in another bucket and keys outside the
        # prefix do not wake t1; t2's wake shows those events had been relayed by then.
        obstore.put(lake.object_store, "t1/part-0.parquet", b"x")
        obstore.put(outside.object_store, commit_key("t1", 20), b"{}")
        obstore.put(other.object_store, commit_key("t1", 30), b"{}")
        assert put_and_wait(lake, t2, commit_key("t2", 4)) < WAKE_LIMIT_S
        assert t2.latest == 4
        assert not t1.wait(0.3)
        assert t1.latest == 7
        assert notifier.healthy
    finally:
        notifier.close()


def test_a_lost_relay_means_polling_until_it_is_back(
    pushing_minio: MinioServer, relay: NotifyRelay
) -> None:
    """A relay that goes away wakes every tail (events may be lost) and makes the notifier
    unhealthy, so tails poll; one on the same address later is used again."""
    spare = NotifyRelay().start()
    lake = Lake(settings_for(pushing_minio, spare, "pushed", "lake"))
    notifier = CommitNotifier(lake)
    try:
        watch = notifier.watch("t9")
        wait_until(lambda: notifier.healthy, 5, "the relay's stream")
        drain(watch)
        port = spare.port
        spare.stop()
        assert watch.wait(5)  # the forced wake of a dropped stream
        wait_until(lambda: not notifier.healthy, 5, "an unhealthy notifier")
        spare = NotifyRelay(port=port).start()
        wait_until(lambda: notifier.healthy, 10, "a reconnected stream")
    finally:
        notifier.close()
        spare.stop()


def test_subscribing_a_minio_without_the_webhook_target_says_how_to_fix_it(
    minio_lake: Lake,
) -> None:
    with pytest.raises(StorageError) as info:
        subscribe(minio_lake)
    text = str(info.value) + (info.value.hint or "")
    assert "MINIO_NOTIFY_WEBHOOK_ENABLE_DELTABUS=on" in text
    assert minio_lake.settings.secret_key.get_secret_value() not in text  # type: ignore[union-attr]


def _post(url: str, body: bytes, token: str | None = None) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_relay_contract_token_bodies_fan_out_and_pings() -> None:
    with NotifyRelay(token="s3cret") as relay:
        host, port = "127.0.0.1", relay.port
        streams = []
        for _ in range(2):
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("GET", "/events")
            response = conn.getresponse()
            assert response.status == 200
            assert response.readline() == PING_LINE  # headers and a first line at once
            streams.append(response)
        wait_until(lambda: relay.listeners == 2, 5, "two listeners")
        event = {"EventName": "s3:ObjectCreated:Put", "Records": [{"s3": {"k": 1}}]}
        assert _post(f"{relay.url}/minio", json.dumps(event).encode()) == 401
        assert _post(f"{relay.url}/minio", json.dumps(event).encode(), "wrong") == 401
        assert _post(f"{relay.url}/minio", b"{not json", "s3cret") == 400
        assert relay.received == 0
        assert _post(f"{relay.url}/minio", json.dumps(event).encode(), "s3cret") == 200
        for response in streams:
            line = response.readline()
            while line == PING_LINE:
                line = response.readline()
            assert json.loads(line) == {"Records": event["Records"]}
        started = time.monotonic()
        assert streams[0].readline() == PING_LINE  # nothing to send: a ping each second
        assert time.monotonic() - started < 2.5
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{relay.url}/nothing-here", timeout=5)
        assert missing.value.code == 404


def test_cli_minio_up_notify_pushes_commits_and_down_stops_the_relay(
    minio: MinioServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`deltabus minio up --notify`: a relay, a MinIO whose webhook target posts to it, the
    bucket subscribed and the tails pointed at it in the env file; a commit then wakes a
    tail through the relay. A second `up` reuses both; `down` stops both."""
    port, relay_port = free_port(), free_port()
    env_file, env, data_dir, up, down = dev_minio_cli(tmp_path, port, "dev-notify")
    env["DELTABUS_MINIO_BIN"] = str(minio.binary)
    up += ["--notify", "--relay-port", str(relay_port)]
    try:
        result = run_cli(up, env, tmp_path, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"notify relay started at http://127.0.0.1:{relay_port}" in result.stdout
        assert "commit events of 'dev-notify' go to the relay" in result.stdout
        relay_pid = int((data_dir / "relay.pid").read_text())
        for name in [k for k in os.environ if k.startswith(LAKE_ENV_PREFIXES)]:
            monkeypatch.delenv(name)
        settings = load_settings(env_file)
        assert settings.notify and settings.notify_url == f"http://127.0.0.1:{relay_port}/events"
        notifier = CommitNotifier(Lake(settings))
        try:
            watch = notifier.watch("t1")
            wait_until(lambda: notifier.healthy, 5, "the relay's stream")
            drain(watch)
            assert put_and_wait(Lake(settings), watch, commit_key("t1", 0)) < WAKE_LIMIT_S
        finally:
            notifier.close()
        again = run_cli(up, env, tmp_path, timeout=60)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "notify relay already running" in again.stdout
        assert "MinIO already running" in again.stdout
        assert env_file.read_text().count("DELTABUS_NOTIFY_URL=") == 1
    finally:
        stopped = run_cli(down, env, tmp_path, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "stopped MinIO" in stopped.stdout and "stopped the notify relay" in stopped.stdout
    wait_until(lambda: not psutil.pid_exists(relay_pid) or _zombie(relay_pid), 10, "relay exit")


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_relay_process_stops_on_sigterm_even_if_started_with_it_ignored(tmp_path: Path) -> None:
    """A process inherits ignored signals: the relay sets its own SIGTERM handling, so
    `deltabus minio down` (SIGTERM) stops it whatever started it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltabus", "notify", "relay", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    try:
        assert proc.stdout is not None and "relay on" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
