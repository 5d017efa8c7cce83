"""`deltabus serve postgres|opensearch --lease`: two replicas of one sink on real MinIO
and a real PostgreSQL or OpenSearch; one serves, the other stands by. The active one is
SIGKILLed mid-stream: the standby takes the lease and goes on from the position stored in
the target, and the served table or index ends equal to the unified table's net rows,
every row written once.

The verdicts read the lease record in the lake, PostgreSQL's own audit of every position
move and row write (tests/test_serve_postgres.py), and the version OpenSearch stored for
every document (tests/test_serve_opensearch.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving import pg
from deltabus.adapters.serving.opensearch_compare import indexed, indexed_position
from deltabus.adapters.serving.sink_lease import ACTIVE, lease_group
from deltabus.bus.groups import Group, now_ms
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli
from tests.opensearch_fixture import OpenSearch
from tests.pg_fixture import Postgres
from tests.test_serve_opensearch import assert_index_equals_unified, index_name, stored_versions
from tests.test_serve_postgres import (
    UnifiedWriter,
    assert_no_row_written_twice,
    assert_served_equals_unified,
    assert_unbroken_chain,
    install_position_audit,
    served_position,
    table_name,
    wait_position,
)

TTL_S = 3.0


class Replica:
    """One `deltabus serve KIND --lease` process in a session of its own, serving `table`
    (PostgreSQL) or the index of that name (OpenSearch)."""

    def __init__(
        self, env: dict[str, str], tmp_path: Path, name: str, table: str, kind: str = "postgres"
    ) -> None:
        self.name = name
        self.ready = tmp_path / f"{name}.ready"
        self.log = tmp_path / f"{name}.log"
        target = "--table" if kind == "postgres" else "--index"
        args = [sys.executable, "-m", "deltabus", "--json", "serve", kind, "--follow"]
        args += [target, table, "--max-versions", "5", "--ready-file", str(self.ready)]
        args += ["--lease", "--lease-ttl-s", str(TTL_S)]
        with open(self.log, "wb") as err:
            self.process = subprocess.Popen(
                args,
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )

    def serving(self) -> bool:
        """It holds the lease and its sink follows the unified table."""
        return self.ready.exists() and json.loads(self.ready.read_text())["pid"] == self.pid

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def check_alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"{self.name} exited with {code}: {self.tail()}"

    def kill(self) -> None:
        os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> dict:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, self.tail()
        return json.loads(out.strip().splitlines()[-1])


def wait_until(what: str, check, replicas: list[Replica], timeout: float = 90) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        for replica in replicas:
            replica.check_alive()
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.1)


class Churn(threading.Thread):
    """Writes `commits` unified commits of 30 rows, each also retracting five rows of the
    commit before last and re-inserting one of them; halfway it waits for `go_on`.
    `inserted_at` maps each inserted (message, timestamp) to its commit's version."""

    def __init__(self, writer: UnifiedWriter, commits: int = 60) -> None:
        super().__init__(name="churn", daemon=True)
        self.writer, self.commits = writer, commits
        self.go_on, self.done = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.inserted_at: dict[tuple[str, float], int] = {}

    def run(self) -> None:
        try:
            for i in range(self.commits):
                if i == self.commits // 2:
                    assert self.go_on.wait(180), "the test never let the writer go on"
                rows = [(f"m{i}-{j}", float(i * 100 + j), 1) for j in range(30)]
                if i >= 2:
                    rows += [(f"m{i - 2}-{j}", float((i - 2) * 100 + j), -1) for j in range(5)]
                    rows.append((f"m{i - 2}-0", float((i - 2) * 100) + 0.5, 1))
                version = self.writer.commit(rows)
                self.inserted_at.update({(m, ts): version for m, ts, d in rows if d > 0})
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            self.done.set()


def holder(group: Group) -> str | None:
    """The member holding the active lease, None when it is free."""
    lease = group.lease(ACTIVE)
    return None if lease is None or lease.free(now_ms()) else lease.member


def kill_the_active_replica(
    replicas: list[Replica], group: Group, position: Callable[[], int], churn: Churn
) -> Replica:
    """One replica serves while the other stands by; the active one is SIGKILLed
    mid-stream and the standby takes the lease over and serves the rest. Returns the
    standby, once the writer has finished."""
    a, b = replicas
    wait_until("one replica serving", lambda: a.serving() or b.serving(), replicas)
    active, standby = (a, b) if a.serving() else (b, a)
    assert f"-{active.pid}-" in (holder(group) or ""), holder(group)
    churn.start()
    wait_until("the active replica serving commits", lambda: position() >= 10, replicas)
    assert not standby.serving(), "the standby served while the other held the lease"
    active.kill()
    assert not churn.done.is_set(), "the writer finished before the active replica was killed"
    churn.go_on.set()
    wait_until("the standby serving", standby.serving, [standby])
    assert f"-{standby.pid}-" in (holder(group) or ""), holder(group)
    churn.join(180)
    assert not churn.errors, churn.errors
    return standby


def test_a_standby_sink_takes_over_from_a_killed_active_one_exactly_once(
    minio_lake: Lake, postgres: Postgres, tmp_path: Path
) -> None:
    lake = minio_lake
    table = table_name()
    install_position_audit(postgres.dsn, lake, table)
    writer = UnifiedWriter(lake)
    writer.commit([("seed-0", 0.0, 1)])
    env = lake_env(lake) | {"DELTABUS_POSTGRES_DSN": postgres.dsn}
    replicas = [Replica(env, tmp_path, name, table) for name in ("a", "b")]
    group = Group(lake, lease_group("postgres", table, pg.describe(postgres.dsn)))

    def position() -> int:
        return (served_position(postgres.dsn, table) or {}).get("version", -1)

    try:
        standby = kill_the_active_replica(replicas, group, position, Churn(writer))
        last = writer.appender.version()
        wait_position(postgres.dsn, table, last, standby.process)
        report = standby.stop()
    finally:
        for replica in replicas:
            if replica.process.poll() is None:
                replica.kill()
    assert report["version"] == last and report["active_periods"] == 1, report
    assert report["lease_group"] == group.name
    assert holder(group) is None, "a replica that stops releases the lease"
    assert_served_equals_unified(lake, postgres.dsn, table)
    assert_unbroken_chain(postgres.dsn, table, last)
    assert_no_row_written_twice(postgres.dsn, table)


def test_a_standby_index_sink_takes_over_from_a_killed_active_one_exactly_once(
    minio_lake: Lake, opensearch: OpenSearch, tmp_path: Path
) -> None:
    lake, url = minio_lake, opensearch.url
    index = index_name()
    writer = UnifiedWriter(lake)
    seed = writer.commit([("seed-0", 0.0, 1)])
    churn = Churn(writer)
    churn.inserted_at[("seed-0", 0.0)] = seed
    env = lake_env(lake) | {"DELTABUS_OPENSEARCH_URL": url}
    replicas = [Replica(env, tmp_path, name, index, kind="opensearch") for name in ("a", "b")]
    group = Group(lake, lease_group("opensearch", index, osc.describe(url)))

    def position() -> int:
        try:
            found = indexed_position(url, index)
        except Exception:  # noqa: BLE001 - the index does not exist yet
            return -1
        return -1 if found is None else int(found["version"])

    try:
        standby = kill_the_active_replica(replicas, group, position, churn)
        last = writer.appender.version()
        wait_until("the standby at the last version", lambda: position() >= last, [standby])
        report = standby.stop()
    finally:
        for replica in replicas:
            if replica.process.poll() is None:
                replica.kill()
    assert report["version"] == last and report["active_periods"] == 1, report
    assert report["lease_group"] == group.name
    assert holder(group) is None, "a replica that stops releases the lease"
    net = assert_index_equals_unified(lake, url, index)
    # Every document holds the version of the commit that inserted its row: no write of an
    # older state won when the standby replayed what the killed one had in flight.
    versions = stored_versions(url, index)
    assert len(versions) == net["unified_net_rows"]
    rows = indexed(url, index)
    for message, timestamp in zip(rows["message"], rows["timestamp"], strict=True):
        stored, field = versions[message]
        assert stored == field == churn.inserted_at[(message, timestamp)], (message, stored)


def test_a_leased_sink_needs_follow_and_a_usable_lease_time(
    minio_lake: Lake, postgres: Postgres, tmp_path: Path
) -> None:
    env = lake_env(minio_lake) | {"DELTABUS_POSTGRES_DSN": postgres.dsn}
    result = run_cli(["serve", "postgres", "--once", "--lease"], env, tmp_path, timeout=60)
    assert result.returncode == 2 and "--lease runs until stopped" in result.stderr
    result = run_cli(["serve", "postgres", "--lease", "--lease-ttl-s", "0.5"], env, tmp_path)
    assert result.returncode == 2 and "the lease time must be" in result.stderr
    env["DELTABUS_OPENSEARCH_URL"] = "http://127.0.0.1:9"  # never reached
    result = run_cli(["serve", "opensearch", "--once", "--lease"], env, tmp_path, timeout=60)
    assert result.returncode == 2 and "--lease runs until stopped" in result.stderr
