"""The OpenSearch index sink against a real OpenSearch node and real Delta tables.

Unified rows are written with the table's contract (the ETL's own appender) where a test
needs retractions at chosen places, or by the real producer, the ETL and another Delta
writer's deletes and updates end to end. Exactly once is checked three ways: the index
equals the unified table's net content; every document's stored version (the external
version OpenSearch kept) is the unified version that last changed its message, so no
write of an older state won after a replay; and the position document names the last
unified version.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltabus.adapters.dev.opensearch_process import OpenSearchNode, http_json
from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.opensearch import IndexReport, OpenSearchSink
from deltabus.adapters.serving.opensearch_compare import compare_index, indexed, indexed_position
from deltabus.adapters.serving.opensearch_documents import POSITION_INDEX, document_id
from deltabus.adapters.serving.opensearch_target import OpenSearchTarget
from deltabus.adapters.serving.sink_loop import ServeConfig
from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.core.net import free_port
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli
from tests.helpers import wait_for_file
from tests.opensearch_fixture import OpenSearch
from tests.test_foreign_writers import delta, produce, start_etl, stop_etl, wait_for_net
from tests.test_serve_postgres import UnifiedWriter

LONG = "long message " + "x" * 600  # more than an _id can hold: its id is a hash
PREFIXED = "sha256:looks-like-a-hashed-id"


def index_name() -> str:
    return f"indexed-{uuid.uuid4().hex[:10]}"


def serve_once(lake: Lake, url: str, index: str) -> IndexReport:
    return OpenSearchSink(lake, url, ServeConfig(table=index, follow=False)).run()


def content(url: str, index: str) -> dict[str, float]:
    rows = indexed(url, index)
    return dict(zip(rows["message"].to_list(), rows["timestamp"].to_list(), strict=True))


def stored_versions(url: str, index: str) -> dict[str, tuple[int, int]]:
    """message -> (the version OpenSearch stored, the `version` field) of every document."""
    from opensearchpy import helpers

    client = osc.client(url)
    try:
        hits = helpers.scan(client, index=index, query={"query": {"match_all": {}}}, version=True)
        return {h["_source"]["message"]: (h["_version"], h["_source"]["version"]) for h in hits}
    finally:
        client.close()


def assert_index_equals_unified(lake: Lake, url: str, index: str, docs: int | None = None) -> dict:
    diff = compare_index(lake, url, index)
    assert diff["missing"] == 0, diff
    assert diff["extra"] == 0, diff
    assert diff["timestamp_mismatches"] == 0, diff
    assert diff["duplicated_in_unified"] == 0, diff
    assert diff["served_rows"] == diff["unified_net_rows"], diff
    if docs is not None:
        assert diff["served_rows"] == docs, diff
    return diff


def assert_position(url: str, index: str, last: int) -> None:
    """The position document is at `last`, and names this lake's unified table."""
    client = osc.client(url)
    try:
        found = client.get(index=POSITION_INDEX, id=index)
    finally:
        client.close()
    assert found["_source"]["version"] == last, found
    assert found["_source"]["source_table"].endswith(UNIFIED_TABLE), found


# -- sink subprocesses ----------------------------------------------------------------------


def sink_process(env: dict[str, str], cwd: Path, index: str, ready: Path) -> subprocess.Popen:
    ready.unlink(missing_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deltabus",
            "--json",
            "serve",
            "opensearch",
            "--follow",
            "--index",
            index,
            "--max-versions",
            "5",
            "--ready-file",
            str(ready),
        ],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_position(
    url: str, index: str, version: int, process: subprocess.Popen, timeout: float = 180.0
) -> int:
    """Wait until the sink's position reaches `version`; returns the position."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            doc = indexed_position(url, index)
        except Exception:  # noqa: BLE001 - the node is still starting
            doc = None
        if doc is not None and doc["version"] >= version:
            return int(doc["version"])
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"position {doc} did not reach {version}"
        time.sleep(0.2)


def stop_sink(process: subprocess.Popen) -> dict:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


# -- tests ------------------------------------------------------------------------------------


def test_retractions_and_updates_reach_the_index(lake: Lake, opensearch: OpenSearch) -> None:
    url = opensearch.url
    writer = UnifiedWriter(lake)
    writer.commit([("a", 1.0, 1), ("b", 2.0, 1), ("c", 3.0, 1)])
    index = index_name()
    first = serve_once(lake, url, index)
    assert first.snapshot_docs == 3 and first.indexed_docs == 3
    assert content(url, index) == {"a": 1.0, "b": 2.0, "c": 3.0}

    writer.commit([("b", 2.0, -1), ("a", 1.0, -1), ("a", 1.5, 1)])  # delete b, update a
    odd = [("nul\x00message", 6.0, 1), (LONG, 7.5, 1), (PREFIXED, 8.5, 1), ("", 9.5, 1)]
    writer.commit([("d", 4.0, 1), ("e", 5.0, 1), *odd])
    last = writer.commit([("e", 5.0, -1), ("f", 7.0, 1)])  # e: in and out within one run
    second = serve_once(lake, url, index)
    assert second.version == last and second.versions == 3 and second.batches == 1
    expected = {"a": 1.5, "c": 3.0, "d": 4.0, "f": 7.0} | {m: ts for m, ts, _ in odd}
    assert content(url, index) == expected
    assert second.docs_deleted == 1 and second.docs_indexed == 7  # a is one write
    assert_index_equals_unified(lake, url, index, docs=8)
    client = osc.client(url)
    for message in (LONG, PREFIXED, ""):  # ids OpenSearch cannot take, or could mistake
        doc = client.get(index=index, id=document_id(message))
        assert doc["_id"].startswith("sha256:") and doc["_source"]["message"] == message
    assert client.get(index=index, id="nul\x00message")["_source"]["timestamp"] == 6.0
    client.close()

    # A retraction of a row the index does not hold (another timestamp) leaves c alone,
    # as the PostgreSQL sink's DELETE ... WHERE timestamp = ... does.
    writer.commit([("c", 99.0, -1)])
    # A message holding a NUL character is updated, then deleted, like any other.
    writer.commit([("nul\x00message", 6.0, -1), ("nul\x00message", 6.5, 1)])
    serve_once(lake, url, index)
    assert content(url, index)["nul\x00message"] == 6.5 and content(url, index)["c"] == 3.0
    assert_index_equals_unified(lake, url, index, docs=8)
    writer.commit([("nul\x00message", 6.5, -1), ("nul\x00message-2", 8.0, 1), (LONG, 7.5, -1)])
    last = writer.commit([("nul\x00message-2", 8.0, -1), ("g", 9.0, 1)])
    serve_once(lake, url, index)
    expected = {"a": 1.5, "c": 3.0, "d": 4.0, "f": 7.0, "g": 9.0, PREFIXED: 8.5, "": 9.5}
    assert content(url, index) == expected
    assert_index_equals_unified(lake, url, index, docs=7)
    assert_position(url, index, last)

    # Nothing new: a run applies nothing and leaves the position where it was.
    again = serve_once(lake, url, index)
    assert again.batches == 0 and again.version == last

    # A fresh sink loads the same content from a snapshot of the net content.
    other = index_name()
    fresh = serve_once(lake, url, other)
    assert fresh.snapshot_docs == 7 and fresh.version == last
    assert content(url, other) == content(url, index)
    assert {v for v, _ in stored_versions(url, other).values()} == {last}


def unassign_shards(url: str, index: str, unassigned: bool) -> None:
    """Take `index`'s only shard out of service (closed, then reopened bound to a node
    that does not exist), or put it back, as a node recovering after a restart has it."""
    client = osc.client(url)
    try:
        if unassigned:
            client.indices.close(index=index)
            rule = {"index.routing.allocation.require._name": "no-such-node"}
            client.indices.put_settings(index=index, body=rule)
            client.indices.open(index=index, wait_for_active_shards=0)
        else:
            rule = {"index.routing.allocation.require._name": None}
            client.indices.put_settings(index=index, body=rule)
        wanted = {"red"} if unassigned else {"green", "yellow"}
        deadline = time.monotonic() + 30
        while (
            client.cluster.health(index=index)["status"] not in wanted
            or reads_fail(client, index) != unassigned
        ):
            assert time.monotonic() < deadline, f"{index} did not turn {wanted}"
            time.sleep(0.2)
    finally:
        client.close()


def reads_fail(client: Any, index: str) -> bool:
    """True when a multi-get of `index` fails: its shard answers no reads."""
    from opensearchpy.exceptions import TransportError

    try:
        docs = client.mget(index=index, body={"ids": ["probe"]})["docs"]
    except TransportError:
        return True
    return any("error" in doc for doc in docs)


def test_a_retraction_waits_for_a_shard_that_is_not_serving_yet(
    lake: Lake, opensearch: OpenSearch
) -> None:
    """A document the index cannot read yet is not taken for gone: the batch fails as
    transient, the position stays, and the retry deletes it once the shard serves."""
    url = opensearch.url
    writer = UnifiedWriter(lake)
    first = writer.commit([("a", 1.0, 1), ("b", 2.0, 1)])
    index = index_name()
    serve_once(lake, url, index)
    last = writer.commit([("b", 2.0, -1)])
    retraction = pa.table(
        {
            "message": ["b"],
            "timestamp": [2.0],
            "time": [0],
            "diff": [-1],
            "_commit_version": pa.array([last], pa.int64()),
        }
    )
    target = OpenSearchTarget(url, index, source=lake.uri(UNIFIED_TABLE))
    target.open(checked=False)
    try:
        changes = target.changes(retraction)
        unassign_shards(url, index, unassigned=True)
        with pytest.raises(osc.ItemReadsFailed) as raised:
            target.apply(changes, first, last, 0)
        assert target.is_transient(raised.value), raised.value.types
        assert target.position() == first
        unassign_shards(url, index, unassigned=False)
        applied = target.apply(changes, first, last, 0)
    finally:
        target.close()
    assert applied.deleted == 1 and applied.already_applied == 0
    assert content(url, index) == {"a": 1.0}
    assert_index_equals_unified(lake, url, index, docs=1)
    assert_position(url, index, last)


def test_upstream_deletes_and_updates_reach_the_index(
    minio_lake: Lake, opensearch: OpenSearch, tmp_path: Path
) -> None:
    """Producer -> ETL -> `deltabus serve opensearch --follow`, all real processes; another
    Delta writer deletes, re-dates and renames input rows: the index follows."""
    produce(minio_lake)
    etl = start_etl(minio_lake, tmp_path)
    index = index_name()
    env = lake_env(minio_lake) | {"DELTABUS_OPENSEARCH_URL": opensearch.url}
    ready = tmp_path / "sink.ready"
    sink = sink_process(env, tmp_path, index, ready)
    try:
        wait_for_net(minio_lake, etl)
        wait_for_file(ready, sink, timeout=60)
        york, paris = delta(minio_lake, "timezone1"), delta(minio_lake, "timezone2")
        deleted = york.delete("message LIKE '%3'")["num_deleted_rows"]
        moved = paris.update(
            updates={"date": "'2026-07-14 12:00:00.250000 +0200'"}, predicate="message LIKE '%5'"
        )["num_updated_rows"]
        renamed = paris.update(
            updates={"message": "concat(message, '-renamed')"}, predicate="message LIKE '%7'"
        )["num_updated_rows"]
        assert deleted > 20 and moved > 20 and renamed > 20
        expected = wait_for_net(minio_lake, etl)
        status, stderr = stop_etl(etl)
        assert status == 0, stderr[-3000:]
        last = minio_lake.open(UNIFIED_TABLE).version()
        wait_position(opensearch.url, index, last, sink)
        report = stop_sink(sink)
    finally:
        for process in (etl, sink):
            if process.poll() is None:
                process.kill()
    found = content(opensearch.url, index)
    assert set(found) == set(expected)
    assert max(abs(found[m] - ts) for m, ts in expected.items()) < 1e-3
    assert sum(m.endswith("-renamed") for m in found) == renamed
    assert report["docs_deleted"] >= deleted + renamed, report
    assert report["version"] == last
    assert_index_equals_unified(minio_lake, opensearch.url, index, docs=1500 - deleted)
    assert_position(opensearch.url, index, last)


def test_exactly_once_across_sink_sigkills_and_an_opensearch_restart(
    minio_lake: Lake, own_opensearch: OpenSearchNode, tmp_path: Path
) -> None:
    url = own_opensearch.url
    index = index_name()
    writer = UnifiedWriter(minio_lake)
    seed = writer.commit([("seed-0", 0.0, 1)])
    inserted_at: dict[tuple[str, float], int] = {("seed-0", 0.0): seed}
    rng = random.Random(17)
    down = threading.Event()
    written_while_down: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            live: list[tuple[str, float]] = []
            for i in range(80):
                if i == 40:
                    down.wait(300)  # the rest is written once OpenSearch is going down
                rows = [(f"m{i}-{j}", float(i * 100 + j), 1) for j in range(40)]
                if i >= 3:  # retract some rows of earlier commits, and re-insert one of them
                    gone = rng.sample(live, 8)
                    rows += [(m, ts, -1) for m, ts in gone]
                    rows.append((gone[0][0], gone[0][1] + 0.5, 1))
                    live = [x for x in live if x not in gone] + [(gone[0][0], gone[0][1] + 0.5)]
                live += [(m, ts) for m, ts, _ in rows[:40]]
                version = writer.commit(rows)
                inserted_at.update({(m, ts): version for m, ts, d in rows if d > 0})
                if i >= 40:
                    written_while_down.append(version)
                time.sleep(0.03)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            done.set()

    # Generous retry budget: the sink waits out OpenSearch's restart (tens of seconds).
    env = lake_env(minio_lake) | {
        "DELTABUS_OPENSEARCH_URL": url,
        "DELTABUS_RETRY_MAX_WAIT_S": "300",
    }
    ready = tmp_path / "sink.ready"
    sink = sink_process(env, tmp_path, index, ready)
    wait_for_file(ready, sink, timeout=60)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    kills, position = 0, seed
    try:
        while kills < 2:  # each sink killed after it moved the position, mid-stream
            position = wait_position(url, index, position + 1, sink, timeout=60)
            time.sleep(rng.uniform(0.2, 0.8))
            sink.kill()  # SIGKILL: no chance to finish a bulk request or say goodbye
            sink.wait(30)
            assert sink.returncode == -signal.SIGKILL
            kills += 1
            sink = sink_process(env, tmp_path, index, ready)
            wait_for_file(ready, sink, timeout=60)
        assert not done.is_set(), "the writer finished before OpenSearch went down"
        own_opensearch.stop()  # the sink's next bulk request finds nothing listening
        down.set()
        deadline = time.monotonic() + 60
        while len(written_while_down) < 5 and not done.is_set():
            assert time.monotonic() < deadline, "the writer stalled"
            time.sleep(0.1)
        own_opensearch.start()  # same directory, same port
        thread.join(180)
        assert not errors, errors
        last = writer.appender.version()
        wait_position(url, index, last, sink, timeout=300)
        report = stop_sink(sink)
    finally:
        if sink.poll() is None:
            sink.kill()
    assert report["version"] == last
    assert report["reconnects"] >= 1, report
    assert_index_equals_unified(minio_lake, url, index)
    assert_position(url, index, last)
    # Every document holds the version of the unified commit that inserted its row (the
    # snapshot's for the seed): nothing older overwrote it when a batch was replayed.
    net = compare_index(minio_lake, url, index)
    versions = stored_versions(url, index)
    assert len(versions) == net["unified_net_rows"]
    rows = indexed(url, index)
    for message, timestamp in zip(rows["message"], rows["timestamp"], strict=True):
        stored, field = versions[message]
        assert stored == field == inserted_at[(message, timestamp)], (message, stored, field)


class Unauthorized(BaseHTTPRequestHandler):
    """Answers every request as OpenSearch's security plugin answers a wrong password."""

    def _deny(self) -> None:
        body = b"Unauthorized"
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="OpenSearch Security"')
        self.send_header("Content-Type", "text/plain; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = _deny

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unauthorized_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def make_index_red(url: str, index: str) -> None:
    """Create `index` with its only shard bound to a node that does not exist."""
    client = osc.client(url)
    try:
        client.indices.create(
            index=index,
            body={
                "settings": {
                    "index.number_of_shards": 1,
                    "index.number_of_replicas": 0,
                    "index.routing.allocation.require._name": "no-such-node",
                }
            },
            wait_for_active_shards=0,
        )
        deadline = time.monotonic() + 30
        while client.cluster.health(index=index)["status"] != "red":
            assert time.monotonic() < deadline, "the index did not turn red"
            time.sleep(0.2)
    finally:
        client.close()


def drop_index(url: str, index: str) -> None:
    client = osc.client(url)
    try:
        client.indices.delete(index=index, ignore_unavailable=True)
    finally:
        client.close()


@pytest.mark.parametrize(
    "case", ["bad credentials", "unreachable node", "red index", "invalid url"]
)
def test_unusable_opensearch_is_one_clear_error(
    minio_lake: Lake,
    opensearch: OpenSearch,
    unauthorized_port: int,
    tmp_path: Path,
    case: str,
) -> None:
    """Bad credentials are answered by a loopback server speaking as the security plugin
    does (401): the embedded node loads no security plugin."""
    UnifiedWriter(minio_lake).commit([("x", 1.0, 1)])
    secret = "wrong-" + uuid.uuid4().hex
    index = index_name()
    node = osc.parse(opensearch.url).endpoint.split("://", 1)[1]
    url, expected = {
        "bad credentials": (
            f"http://deltabus:{secret}@127.0.0.1:{unauthorized_port}",
            "OpenSearch rejected the credentials",
        ),
        "unreachable node": (
            f"http://deltabus:{secret}@127.0.0.1:{free_port()}",
            "cannot reach OpenSearch",
        ),
        "red index": (f"http://{node}", f"index {index} has a primary shard that is not"),
        "invalid url": (f"ftp://deltabus:{secret}@{node}", "not a valid OpenSearch URL"),
    }[case]
    if case == "red index":
        make_index_red(opensearch.url, index)
    env = lake_env(minio_lake) | {"DELTABUS_OPENSEARCH_URL": url}
    try:
        started = time.monotonic()
        args = ["serve", "opensearch", "--once", "--index", index]
        result = run_cli(args, env, tmp_path, timeout=60)
        assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
        assert expected in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        lines = [line for line in result.stderr.splitlines() if line.startswith("deltabus:")]
        assert len(lines) == 1, result.stderr
        assert secret not in result.stdout + result.stderr
        assert time.monotonic() - started < 30  # no retrying through a wrong setting
        # The same through --url on the command line.
        env.pop("DELTABUS_OPENSEARCH_URL")
        result = run_cli([*args, "--url", url], env, tmp_path, timeout=60)
        assert result.returncode == 2 and expected in result.stderr, result.stderr
        assert secret not in result.stdout + result.stderr
    finally:
        if case == "red index":
            drop_index(opensearch.url, index)


def test_no_opensearch_configured_names_the_fix(minio_lake: Lake, tmp_path: Path) -> None:
    env = {k: v for k, v in lake_env(minio_lake).items() if k != "DELTABUS_OPENSEARCH_URL"}
    result = run_cli(["serve", "opensearch", "--once"], env, tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "DELTABUS_OPENSEARCH_URL" in result.stderr
    assert "deltabus opensearch up" in result.stderr


def test_local_node_up_and_down(tmp_path: Path) -> None:
    """`deltabus opensearch up` starts a node on loopback and writes its URL to .env;
    `down` stops it; `up` again starts the same node on the same port."""
    from tests.opensearch_fixture import require_opensearch_jars

    require_opensearch_jars()
    env_file = tmp_path / "dev.env"
    env_file.write_text("")
    data_dir = tmp_path / "opensearch"
    up = ["--env-file", str(env_file), "opensearch", "up", "--data-dir", str(data_dir)]
    down = ["opensearch", "down", "--data-dir", str(data_dir)]
    env = dict(os.environ)  # holds no lake or OpenSearch setting (tests/conftest.py)
    try:
        started = run_cli(up, env, tmp_path, timeout=300)
        assert started.returncode == 0, started.stderr[-3000:]
        (url,) = [
            line.split("=", 1)[1]
            for line in env_file.read_text().splitlines()
            if line.startswith("DELTABUS_OPENSEARCH_URL=")
        ]
        assert url.startswith("http://127.0.0.1:")
        assert http_json(f"{url}/_cluster/health")["status"] in ("green", "yellow")
        again = run_cli(up, env, tmp_path, timeout=60)
        assert again.returncode == 0 and "is running" in again.stdout, again.stderr
        stopped = run_cli(down, env, tmp_path, timeout=120)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
        assert http_json(f"{url}/") is None
        restarted = run_cli(up, env, tmp_path, timeout=300)
        assert restarted.returncode == 0 and "started" in restarted.stdout, restarted.stderr
        assert http_json(f"{url}/_cluster/health")["status"] in ("green", "yellow")
        assert env_file.read_text().count("DELTABUS_OPENSEARCH_URL=") == 1
    finally:
        run_cli(down, env, tmp_path, timeout=120)
