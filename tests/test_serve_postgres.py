"""The PostgreSQL serving sink against a real PostgreSQL and real Delta tables.

Unified rows are written with the table's contract (the ETL's own appender) where a test
needs retractions at chosen places, or by the real producer and ETL end to end. Exactly
once is checked three ways: the served table equals the unified table's net content;
a trigger on `deltabus_sink_position` records every move of the position, which must form
one unbroken chain; and a trigger on the served table records every row written, and no
row may be written twice (upserts are idempotent, so a version applied twice would not
show in the content alone).
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
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltabus.adapters.dev.postgres_process import PostgresServer
from deltabus.adapters.serving import pg
from deltabus.adapters.serving.compare import compare, served, served_position
from deltabus.adapters.serving.postgres_sink import PostgresSink, ServeConfig
from deltabus.adapters.serving.postgres_target import POSITION_TABLE, PostgresTarget
from deltabus.apps.timezones.contracts import INPUT_SCHEMA, UNIFIED_SCHEMA, UNIFIED_TABLE
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.core.errors import ConfigError
from deltabus.core.net import free_port
from deltabus.delta.append import TableAppender
from deltabus.delta.lake import Lake
from deltabus.delta.tables import TABLE_CONFIGURATION, ensure_table
from tests.conftest import lake_env, run_cli
from tests.helpers import assert_exactly_once, etl_process, wait_for_file
from tests.pg_fixture import Postgres


def table_name() -> str:
    return f"served_{uuid.uuid4().hex[:10]}"


class UnifiedWriter:
    """Appends rows to timezone_unified with its contract, one commit per call."""

    def __init__(self, lake: Lake) -> None:
        dt = ensure_table(lake, UNIFIED_TABLE, UNIFIED_SCHEMA)
        self.appender = TableAppender(lake, UNIFIED_TABLE, dt)
        self.seq = 0

    def commit(self, rows: list[tuple[str, float, int]]) -> int:
        """Rows as (message, timestamp, diff); returns the new version."""
        now = int(time.time() * 1000)
        data = pa.table(
            {
                "timestamp": [r[1] for r in rows],
                "message": [r[0] for r in rows],
                "time": [now] * len(rows),
                "diff": [r[2] for r in rows],
            },
            schema=UNIFIED_SCHEMA,
        )
        self.appender.append_once(
            data, app_id="test-writer", seq=self.seq, custom_metadata={}, what="append test rows"
        )
        self.seq += 1
        return self.appender.version()


def serve_once(lake: Lake, dsn: str, table: str):  # noqa: ANN201 - ServeReport
    return PostgresSink(lake, dsn, ServeConfig(table=table, follow=False)).run()


def content(dsn: str, table: str) -> dict[str, float]:
    rows = served(dsn, table)
    return dict(zip(rows["message"].to_list(), rows["timestamp"].to_list(), strict=True))


def assert_served_equals_unified(lake: Lake, dsn: str, table: str, rows: int | None = None):  # noqa: ANN201
    diff = compare(lake, dsn, table)
    assert diff["missing"] == 0, diff
    assert diff["extra"] == 0, diff
    assert diff["timestamp_mismatches"] == 0, diff
    assert diff["duplicated_in_unified"] == 0, diff
    assert diff["served_rows"] == diff["unified_net_rows"], diff
    if rows is not None:
        assert diff["served_rows"] == rows, diff
    return diff


# -- the position audit: every move of a sink's position, recorded by PostgreSQL itself --


def install_position_audit(dsn: str, lake: Lake, table: str) -> None:
    PostgresTarget(dsn, table, source=lake.uri(UNIFIED_TABLE)).open()  # creates the tables
    con = pg.connect(dsn)
    con.autocommit = True
    with con.cursor() as cur:
        cur.execute(
            """CREATE TABLE IF NOT EXISTS test_position_audit (
                 id bigserial PRIMARY KEY, sink text, old_version bigint, new_version bigint)"""
        )
        cur.execute(
            """CREATE OR REPLACE FUNCTION test_audit_position() RETURNS trigger AS $$
               BEGIN
                 INSERT INTO test_position_audit (sink, old_version, new_version)
                 VALUES (NEW.sink, OLD.version, NEW.version);
                 RETURN NEW;
               END $$ LANGUAGE plpgsql"""
        )
        cur.execute(
            f"""CREATE OR REPLACE TRIGGER test_audit_position AFTER UPDATE ON {POSITION_TABLE}
                FOR EACH ROW EXECUTE FUNCTION test_audit_position()"""
        )
        cur.execute(
            """CREATE TABLE IF NOT EXISTS test_row_audit (
                 id bigserial PRIMARY KEY, served text, op text, message text,
                 "timestamp" double precision)"""
        )
        cur.execute(
            """CREATE OR REPLACE FUNCTION test_audit_row() RETURNS trigger AS $$
               BEGIN
                 IF TG_OP = 'DELETE' THEN
                   INSERT INTO test_row_audit (served, op, message, "timestamp")
                   VALUES (TG_TABLE_NAME, 'delete', OLD.message, OLD."timestamp");
                 ELSE
                   INSERT INTO test_row_audit (served, op, message, "timestamp")
                   VALUES (TG_TABLE_NAME, 'write', NEW.message, NEW."timestamp");
                 END IF;
                 RETURN NULL;
               END $$ LANGUAGE plpgsql"""
        )
        cur.execute(
            f"""CREATE OR REPLACE TRIGGER test_audit_row AFTER INSERT OR UPDATE OR DELETE
                ON {table} FOR EACH ROW EXECUTE FUNCTION test_audit_row()"""
        )
    con.close()


def assert_no_row_written_twice(dsn: str, table: str) -> int:
    """Every (message, timestamp) was written at most once and deleted at most once."""
    con = pg.connect(dsn)
    with con.cursor() as cur:
        cur.execute(
            """SELECT op, message, "timestamp", count(*) FROM test_row_audit
               WHERE served = %s GROUP BY 1, 2, 3 HAVING count(*) > 1 LIMIT 5""",
            (table,),
        )
        twice = cur.fetchall()
        cur.execute("SELECT count(*) FROM test_row_audit WHERE served = %s", (table,))
        events = cur.fetchone()[0]
    con.close()
    assert not twice, f"rows written more than once: {twice}"
    return int(events)


def assert_unbroken_chain(dsn: str, sink: str, last: int) -> int:
    """Each transaction moved the position from where the previous one left it."""
    con = pg.connect(dsn)
    with con.cursor() as cur:
        cur.execute(
            "SELECT old_version, new_version FROM test_position_audit WHERE sink = %s ORDER BY id",
            (sink,),
        )
        moves = cur.fetchall()
    con.close()
    assert moves, "the position never moved"
    assert moves[0][0] == -1, moves[:3]
    for (_, before), (after, new) in zip(moves, moves[1:], strict=False):
        assert after == before, f"a move from {after} after one to {before}: {moves}"
        assert new > after, moves
    assert moves[-1][1] == last, (moves[-3:], last)
    return len(moves)


# -- sink subprocesses ----------------------------------------------------------------------


def sink_process(env: dict[str, str], cwd: Path, table: str, ready: Path) -> subprocess.Popen:
    ready.unlink(missing_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deltabus",
            "--json",
            "serve",
            "postgres",
            "--follow",
            "--table",
            table,
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


def wait_position(dsn: str, sink: str, version: int, process: subprocess.Popen, timeout=90.0):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while True:
        row = served_position(dsn, sink)
        if row is not None and row["version"] >= version:
            return
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"position {row} did not reach {version}"
        time.sleep(0.1)


def stop_sink(process: subprocess.Popen) -> dict:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


# -- tests ------------------------------------------------------------------------------------


def test_retractions_and_updates_reach_the_served_table(lake: Lake, postgres: Postgres) -> None:
    writer = UnifiedWriter(lake)
    writer.commit([("a", 1.0, 1), ("b", 2.0, 1), ("c", 3.0, 1)])
    table = table_name()
    first = serve_once(lake, postgres.dsn, table)
    assert first.snapshot_rows == 3 and first.served_rows == 3
    assert content(postgres.dsn, table) == {"a": 1.0, "b": 2.0, "c": 3.0}

    writer.commit([("b", 2.0, -1), ("a", 1.0, -1), ("a", 1.5, 1)])  # delete b, update a
    writer.commit([("d", 4.0, 1), ("e", 5.0, 1), ("nul\x00message", 6.0, 1)])
    last = writer.commit([("e", 5.0, -1), ("f", 7.0, 1)])  # e: in and out within one run
    second = serve_once(lake, postgres.dsn, table)
    assert second.version == last and second.versions == 3 and second.transactions == 1
    assert content(postgres.dsn, table) == {
        "a": 1.5,
        "c": 3.0,
        "d": 4.0,
        "f": 7.0,
        "nul\x00message": 6.0,
    }
    assert second.rows_deleted == 2  # b, and a's old row
    assert second.rows_escaped == 1
    assert "rows_skipped_nul" not in second.as_dict()
    assert_served_equals_unified(lake, postgres.dsn, table, rows=5)

    # A message holding a NUL is updated, then deleted, like any other.
    writer.commit([("nul\x00message", 6.0, -1), ("nul\x00message", 6.5, 1)])
    serve_once(lake, postgres.dsn, table)
    assert content(postgres.dsn, table)["nul\x00message"] == 6.5
    assert_served_equals_unified(lake, postgres.dsn, table, rows=5)
    writer.commit([("nul\x00message", 6.5, -1), ("nul\x00message-2", 8.0, 1)])
    last = writer.commit([("nul\x00message-2", 8.0, -1), ("g", 9.0, 1)])
    serve_once(lake, postgres.dsn, table)
    assert content(postgres.dsn, table) == {"a": 1.5, "c": 3.0, "d": 4.0, "f": 7.0, "g": 9.0}
    assert_served_equals_unified(lake, postgres.dsn, table, rows=5)

    # Nothing new: a run applies nothing and leaves the position where it was.
    again = serve_once(lake, postgres.dsn, table)
    assert again.transactions == 0 and again.version == last

    # A fresh sink loads the same content from a snapshot of the net content.
    other = table_name()
    fresh = serve_once(lake, postgres.dsn, other)
    assert fresh.snapshot_rows == 5 and fresh.version == last
    assert content(postgres.dsn, other) == content(postgres.dsn, table)


# Messages holding a NUL character (valid UTF-8 the ETL delivers) and NUL-free messages that
# read like a NUL message's stored form, or hold JSON's special characters.
NUL_MESSAGES = ["nul\x00inside", "\x00", "\x00\x00 twice \x00"]
LOOKALIKES = [json.dumps("nul\x00inside"), '"\\u0000"', 'quote " back\\slash \\u0000']


def write_input_rows(lake: Lake, messages: list[str]) -> None:
    """`messages` appended to timezone1 as another Delta writer would, one valid date each."""
    ensure_table(lake, "timezone1", INPUT_SCHEMA)
    rows = pa.table(
        {"date": ["2026-11-21 10:00:00.000000 +0100"] * len(messages), "message": messages},
        schema=INPUT_SCHEMA,
    )
    write_deltalake(
        lake.uri("timezone1"),
        rows,
        mode="append",
        storage_options=lake.storage_options,
        configuration=TABLE_CONFIGURATION,
    )


def produce_and_transform(lake: Lake, env: dict[str, str], cwd: Path, run: str) -> None:
    """A producer run after the rows written so far, then the ETL (its own process) until
    that run is finished."""
    TimezoneProducer(
        lake, ProducerConfig(rate=2000, count=300, commit_interval=0.05, run_id=run)
    ).run()
    etl = run_cli(["etl", "--mode", "bounded", "--until-run", run], env, cwd, timeout=300)
    assert etl.returncode == 0, etl.stderr[-3000:]


def serve_cli(env: dict[str, str], cwd: Path, table: str) -> dict:
    result = run_cli(["--json", "serve", "postgres", "--once", "--table", table], env, cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_messages_with_a_nul_character_are_served_through_the_pipeline(
    minio_lake: Lake, postgres: Postgres, tmp_path: Path
) -> None:
    """Input rows -> the ETL -> timezone_unified -> `deltabus serve postgres`, all real
    processes: a message holding a NUL is served, and read back as it is."""
    env = lake_env(minio_lake) | {"DELTABUS_POSTGRES_DSN": postgres.dsn}
    table = table_name()
    write_input_rows(minio_lake, [NUL_MESSAGES[0], *LOOKALIKES])
    produce_and_transform(minio_lake, env, tmp_path, "nul-a")
    first = serve_cli(env, tmp_path, table)  # a fresh sink: the snapshot
    assert first["rows_escaped"] == 1 and "rows_skipped_nul" not in first, first
    assert first["served_rows"] == first["unified_net_rows"] == 300 + 1 + len(LOOKALIKES)

    write_input_rows(minio_lake, NUL_MESSAGES[1:])
    produce_and_transform(minio_lake, env, tmp_path, "nul-b")
    second = serve_cli(env, tmp_path, table)  # the commits after it
    assert second["rows_escaped"] == len(NUL_MESSAGES) - 1, second
    assert second["served_rows"] == second["unified_net_rows"], second

    unified = assert_exactly_once(minio_lake, expected=600 + len(NUL_MESSAGES + LOOKALIKES))
    served_now = content(postgres.dsn, table)
    for message in NUL_MESSAGES + LOOKALIKES:
        assert message in set(unified["message"]), message
        assert message in served_now, message
    assert_served_equals_unified(minio_lake, postgres.dsn, table, rows=unified.height)
    con = pg.connect(postgres.dsn)
    with con.cursor() as cur:  # what a reader of the table sees: no NUL, a flag to decode by
        cur.execute(f"SELECT message FROM {table} WHERE message_escaped ORDER BY message")
        stored = [row[0] for row in cur.fetchall()]
    con.close()
    assert stored == sorted(json.dumps(m, ensure_ascii=False) for m in NUL_MESSAGES)


def test_a_served_table_without_message_escaped_is_refused(
    minio_lake: Lake, postgres: Postgres
) -> None:
    UnifiedWriter(minio_lake).commit([("x", 1.0, 1)])
    table = table_name()
    con = pg.connect(postgres.dsn)
    con.autocommit = True
    with con.cursor() as cur:
        cur.execute(
            f"""CREATE TABLE {table} (message text NOT NULL PRIMARY KEY,
                "timestamp" double precision NOT NULL, "time" bigint NOT NULL,
                version bigint NOT NULL)"""
        )
    con.close()
    with pytest.raises(ConfigError, match="no message_escaped column") as raised:
        serve_once(minio_lake, postgres.dsn, table)
    assert f"sink = '{table}'" in raised.value.hint


def test_exactly_once_across_sink_sigkills(
    minio_lake: Lake, postgres: Postgres, tmp_path: Path
) -> None:
    table = table_name()
    install_position_audit(postgres.dsn, minio_lake, table)
    writer = UnifiedWriter(minio_lake)
    writer.commit([("seed-0", 0.0, 1)])
    rng = random.Random(16)
    commits = 90
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            live: list[tuple[str, float]] = []
            for i in range(commits):
                rows = [(f"m{i}-{j}", float(i * 100 + j), 1) for j in range(40)]
                if i >= 3:  # retract some rows of earlier commits, and re-insert one of them
                    gone = rng.sample(live, 8)
                    rows += [(m, ts, -1) for m, ts in gone]
                    rows.append((gone[0][0], gone[0][1] + 0.5, 1))
                    live = [x for x in live if x not in gone] + [(gone[0][0], gone[0][1] + 0.5)]
                live += [(m, ts) for m, ts, _ in rows[:40]]
                writer.commit(rows)
                time.sleep(0.03)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            done.set()

    env = lake_env(minio_lake) | {"DELTABUS_POSTGRES_DSN": postgres.dsn}
    ready = tmp_path / "sink.ready"
    sink = sink_process(env, tmp_path, table, ready)
    wait_for_file(ready, sink, timeout=60)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    kills = 0
    try:
        while kills < 3 and not done.is_set():
            time.sleep(rng.uniform(0.4, 0.9))
            position = (served_position(postgres.dsn, table) or {}).get("version", -1)
            sink.kill()  # SIGKILL: no chance to finish a transaction or say goodbye
            sink.wait(30)
            assert sink.returncode == -signal.SIGKILL
            kills += 1 if position >= 1 else 0
            sink = sink_process(env, tmp_path, table, ready)
            wait_for_file(ready, sink, timeout=60)
        thread.join(120)
        assert not errors, errors
        assert kills >= 2, "the writer finished before the sink was killed twice mid-stream"
        last = writer.appender.version()
        wait_position(postgres.dsn, table, last, sink)
        report = stop_sink(sink)
    finally:
        if sink.poll() is None:
            sink.kill()
    assert report["version"] == last
    assert "password" not in json.dumps(report)
    assert_served_equals_unified(minio_lake, postgres.dsn, table)
    transactions = assert_unbroken_chain(postgres.dsn, table, last)
    assert transactions >= 4
    assert assert_no_row_written_twice(postgres.dsn, table) > commits * 40


def test_postgres_restart_mid_stream_loses_and_duplicates_nothing(
    minio_lake: Lake, own_postgres: PostgresServer, tmp_path: Path
) -> None:
    """Producer -> ETL -> sink, end to end; PostgreSQL stops and starts on the same port."""
    table = table_name()
    env = lake_env(minio_lake) | {"DELTABUS_POSTGRES_DSN": own_postgres.dsn}
    etl_ready, sink_ready = tmp_path / "etl.ready", tmp_path / "sink.ready"
    install_position_audit(own_postgres.dsn, minio_lake, table)
    etl = etl_process(env, tmp_path, "--mode", "bounded", "--ready-file", str(etl_ready))
    sink = sink_process(env, tmp_path, table, sink_ready)
    produced: list[int] = []
    producer = threading.Thread(
        target=lambda: produced.append(
            TimezoneProducer(
                minio_lake,
                ProducerConfig(rate=1500, count=9000, commit_interval=0.1, run_id="pgrestart"),
            )
            .run()
            .messages
        ),
        daemon=True,
    )
    try:
        wait_for_file(etl_ready, etl, timeout=120)
        wait_for_file(sink_ready, sink, timeout=60)
        producer.start()
        wait_position(own_postgres.dsn, table, 5, sink)  # the stream reaches PostgreSQL
        own_postgres.stop()  # fast shutdown: the sink's session is ended mid-stream
        time.sleep(2.0)
        own_postgres.start()  # same port, same data
        producer.join(120)
        _, etl_err = etl.communicate(timeout=180)
        assert etl.returncode == 0, etl_err[-3000:]
        last = minio_lake.open(UNIFIED_TABLE).version()
        wait_position(own_postgres.dsn, table, last, sink)
        report = stop_sink(sink)
    finally:
        for process in (etl, sink):
            if process.poll() is None:
                process.kill()
    assert produced == [9000]
    assert_exactly_once(minio_lake, expected=9000)
    assert report["reconnects"] >= 1, report
    assert report["version"] == last
    assert_served_equals_unified(minio_lake, own_postgres.dsn, table, rows=9000)
    assert_unbroken_chain(own_postgres.dsn, table, last)
    assert assert_no_row_written_twice(own_postgres.dsn, table) == 9000


@pytest.mark.parametrize("case", ["bad password", "unreachable port", "invalid dsn"])
def test_unusable_postgres_is_one_clear_error(
    minio_lake: Lake, postgres: Postgres, tmp_path: Path, case: str
) -> None:
    UnifiedWriter(minio_lake).commit([("x", 1.0, 1)])
    secret = "wrong-" + uuid.uuid4().hex
    parts = pg.parse(postgres.dsn)
    host, port = parts.get("host", "127.0.0.1"), parts.get("port", "5432")
    user, db = parts.get("user", "deltabus"), parts.get("dbname", "deltabus")
    dsn, expected = {
        "bad password": (
            f"postgresql://{user}:{secret}@{host}:{port}/{db}",
            "PostgreSQL rejected the credentials",
        ),
        "unreachable port": (
            f"postgresql://{user}:{secret}@127.0.0.1:{free_port()}/{db}",
            "cannot reach PostgreSQL",
        ),
        "invalid dsn": (f"host=127.0.0.1 password={secret} dbname", "not a valid PostgreSQL"),
    }[case]
    env = lake_env(minio_lake) | {"DELTABUS_POSTGRES_DSN": dsn}
    started = time.monotonic()
    result = run_cli(["serve", "postgres", "--once"], env, tmp_path, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("deltabus:")]
    assert len(lines) == 1, result.stderr
    assert secret not in result.stdout + result.stderr
    assert time.monotonic() - started < 30  # no retrying through a wrong setting
    # The same through --dsn on the command line.
    env.pop("DELTABUS_POSTGRES_DSN")
    result = run_cli(["serve", "postgres", "--once", "--dsn", dsn], env, tmp_path, timeout=60)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert secret not in result.stdout + result.stderr


def test_no_postgres_configured_names_the_fix(minio_lake: Lake, tmp_path: Path) -> None:
    env = {k: v for k, v in lake_env(minio_lake).items() if k != "DELTABUS_POSTGRES_DSN"}
    result = run_cli(["serve", "postgres", "--once"], env, tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "DELTABUS_POSTGRES_DSN" in result.stderr and "deltabus postgres up" in result.stderr


def test_local_server_runs_unprivileged_on_loopback(own_postgres: PostgresServer) -> None:
    con = pg.connect(own_postgres.dsn)
    with con.cursor() as cur:
        cur.execute("SHOW listen_addresses")
        assert cur.fetchone()[0] == "127.0.0.1"
        cur.execute("SHOW password_encryption")
        assert cur.fetchone()[0] == "scram-sha-256"
    con.close()
    owner = os.stat(own_postgres.data_dir).st_uid
    assert owner != 0 or os.geteuid() != 0  # never runs as root
