"""Checkpoints written from memory (deltabus.delta.checkpoint_writer) on real tables, MinIO and
local: fast appends mixed with delta-rs appends, a txn update, a delete and a compaction;
once the commits the checkpoint covers are gone, delta-rs, DuckDB and our tail read
exactly the rows written from it, and it holds what delta-rs' own checkpoint holds."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA
from deltabus.apps.timezones.duck import lake_connection
from deltabus.core.settings import Settings
from deltabus.delta.append import TableAppender
from deltabus.delta.checkpoint_state import TableState, Unsupported, parse_interval_ms
from deltabus.delta.checkpoint_writer import (
    CheckpointWriter,
    cleanup_expired_logs,
    create_checkpoint_once,
)
from deltabus.delta.checkpoints import BackgroundCheckpointer
from deltabus.delta.lake import Lake
from deltabus.delta.maintenance import maintain_table
from deltabus.delta.snapshots import DeltaLog, parse_actions, snapshot_at
from deltabus.delta.table_files import TableFiles, concat
from deltabus.delta.tables import ensure_table, metadata
from tests.helpers import unified_rows as rows
from tests.test_spark_interop import s3a, spark  # noqa: F401 - fixture

ACTION_KINDS = ("add", "remove", "txn", "protocol", "metaData", "domainMetadata")


def append(appender: TableAppender, seq: int, data: pa.Table, cp: BackgroundCheckpointer | None):
    return appender.append_once(
        data,
        app_id="w",
        seq=seq,
        custom_metadata=metadata(seq=seq),
        what="test append",
        markers={"w:next": seq + 1},
        checkpointer=cp,
    )


def log_dir(table: str) -> str:
    return f"{table}/_delta_log"


def log_names(lake: Lake, table: str) -> list[str]:
    return sorted(
        m["path"].rsplit("/", 1)[-1]
        for chunk in obstore.list(lake.object_store, prefix=f"{log_dir(table)}/")
        for m in chunk
    )


def read_log_file(lake: Lake, table: str, name: str) -> bytes:
    return bytes(obstore.get(lake.object_store, f"{log_dir(table)}/{name}").bytes())


def delta_rs_checkpoint(lake: Lake, table: str, version: int, scratch: Path) -> bytes:
    """What delta-rs' own `create_checkpoint` writes at `version`, from the JSON commits
    alone (copied to a scratch table without any checkpoint)."""
    target = scratch / "delta_rs_copy" / "_delta_log"
    target.mkdir(parents=True)
    for v in range(version + 1):
        (target / f"{v:020d}.json").write_bytes(read_log_file(lake, table, f"{v:020d}.json"))
    dt = DeltaTable(str(target.parent), version=version)
    dt.create_checkpoint()
    return (target / f"{version:020d}.checkpoint.parquet").read_bytes()


def content(raw: bytes) -> dict[str, list[str]]:
    """A checkpoint's actions by kind, comparable across writers: nulls dropped, removes
    as tombstones (path, deletion time, dataChange, size)."""
    table = pq.read_table(pa.BufferReader(raw))
    out: dict[str, list[str]] = {}
    for kind in ACTION_KINDS:
        if kind not in table.column_names:
            out[kind] = []
            continue
        values = table.column(kind).to_pylist(maps_as_pydicts="strict")
        actions = [{k: v for k, v in a.items() if v is not None} for a in values if a is not None]
        if kind == "remove":
            keep = ("path", "deletionTimestamp", "dataChange", "size")
            actions = [{k: a.get(k) for k in keep} for a in actions]
        out[kind] = sorted(json.dumps(a, sort_keys=True) for a in actions)
    return out


def drop_commits_through(lake: Lake, table: str, version: int) -> None:
    """Delete the JSON commits a checkpoint at `version` covers, as log cleanup would:
    from here on a reader must take the table state from that checkpoint."""
    doomed = [
        f"{log_dir(table)}/{name}"
        for name in log_names(lake, table)
        if name.endswith(".json") and int(name[:20]) <= version
    ]
    obstore.delete(lake.object_store, doomed)


def read_with_tail(lake: Lake, table: str, version: int) -> pa.Table:
    """The table at `version` as our tail reads it: checkpoint + commits, then the files."""
    delta_log = DeltaLog(lake.object_store, table)
    snapshot = snapshot_at(delta_log, version, files=True)
    assert snapshot is not None and snapshot.state is not None and snapshot.files is not None
    files = TableFiles(lake.object_store, table, lake.root)
    return concat([files.read(snapshot.state, a, "test") for a in snapshot.files.values()])


def read_with_duckdb(lake: Lake, table: str, checkpoint: bytes, after: list[bytes]) -> set[str]:
    """Messages DuckDB reads from the live files it finds in our checkpoint Parquet (plus
    the adds and removes of later commits), with its own Parquet reader throughout."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.parquet"
        path.write_bytes(checkpoint)
        con = duckdb.connect()
        live = {
            p
            for (p,) in con.execute(
                f"""SELECT "add"."path" FROM read_parquet('{path}') WHERE "add" IS NOT NULL"""
            ).fetchall()
        }
        for raw in after:
            actions = parse_actions(raw)
            live -= {r["path"] for r in actions.get("remove", ())}
            live |= {a["path"] for a in actions.get("add", ())}
        local = []
        for i, name in enumerate(sorted(live)):
            local.append(Path(tmp) / f"{i}.parquet")
            local[-1].write_bytes(bytes(obstore.get(lake.object_store, f"{table}/{name}").bytes()))
        files = ", ".join(f"'{p}'" for p in local)
        found = con.execute(f"SELECT message FROM read_parquet([{files}])").fetchall()
    messages = [m for (m,) in found]
    assert len(messages) == len(set(messages)), "DuckDB read a row twice"
    return set(messages)


def test_checkpoints_from_memory_read_back_everywhere(lake: Lake, tmp_path: Path) -> None:
    dt = ensure_table(lake, "t", UNIFIED_SCHEMA)
    checkpointer = BackgroundCheckpointer(lake, "t", interval=7)
    appender = TableAppender(lake, "t", dt)
    assert appender.fast
    expected: set[str] = set()
    other_txn = None
    for seq in range(40):
        assert append(appender, seq, rows(seq * 10, 10), checkpointer)
        expected |= {f"m{i}" for i in range(seq * 10, seq * 10 + 10)}
        if seq % 6 == 2:  # another writer: delta-rs, with an app transaction of its own
            other_txn = seq
            write_deltalake(
                lake.uri("t"),
                rows(10_000 + seq * 3, 3),
                mode="append",
                storage_options=lake.storage_options,
                commit_properties=CommitProperties(app_transactions=[Transaction("other", seq)]),
            )
            expected |= {f"m{i}" for i in range(10_000 + seq * 3, 10_000 + seq * 3 + 3)}
        if seq == 17:  # removes rows: a data-changing remove and a rewritten file
            lake.open("t").delete("time < 15")
            expected -= {f"m{i}" for i in range(15)}
        if seq == 25:  # compaction: removes with dataChange false, one new add
            lake.open("t").optimize.compact()
        time.sleep(0.02)
    checkpointer.close()
    last = appender.version()

    assert checkpointer.failures == 0
    assert checkpointer.from_memory == checkpointer.written
    assert len(checkpointer.written) >= 5
    assert checkpointer.writer.seeds == 1  # seeded once; every later commit was fed
    checkpoint = checkpointer.written[-1]
    assert last - checkpoint < 7
    hint = json.loads(read_log_file(lake, "t", "_last_checkpoint"))
    assert hint["version"] == checkpoint
    ours = read_log_file(lake, "t", f"{checkpoint:020d}.checkpoint.parquet")
    assert hint["size"] == pq.read_metadata(pa.BufferReader(ours)).num_rows

    # The same actions as delta-rs' own checkpoint at that version.
    theirs = delta_rs_checkpoint(lake, "t", checkpoint, tmp_path)
    assert content(ours) == content(theirs)
    assert content(ours)["remove"]  # the delete and the compaction left tombstones
    copy = DeltaTable(str(tmp_path / "delta_rs_copy"), version=checkpoint)
    ours_at = lake.open("t", version=checkpoint)
    assert ours_at.file_uris() and len(ours_at.file_uris()) == len(copy.file_uris())
    assert {Path(u).name for u in ours_at.file_uris()} == {Path(u).name for u in copy.file_uris()}
    mine_adds = pa.table(ours_at.get_add_actions(flatten=True)).sort_by("path")
    their_adds = pa.table(copy.get_add_actions(flatten=True)).sort_by("path")
    assert mine_adds.equals(their_adds)

    # Readers that can only get the state from our checkpoint.
    after = [read_log_file(lake, "t", f"{v:020d}.json") for v in range(checkpoint + 1, last + 1)]
    drop_commits_through(lake, "t", checkpoint)
    fresh = lake.open("t")
    assert fresh.version() == last
    messages = fresh.to_pyarrow_table().column("message").to_pylist()
    assert len(messages) == len(set(messages)) and set(messages) == expected
    assert fresh.transaction_version("w") == 39
    assert fresh.transaction_version("w:next") == 40
    assert fresh.transaction_version("other") == other_txn
    con = lake_connection(lake, ("t",))  # how the checks and latency assets query
    assert con.execute("SELECT count(*), count(DISTINCT message) FROM t").fetchone() == (
        len(expected),
        len(expected),
    )
    assert read_with_duckdb(lake, "t", ours, after) == expected
    tailed = read_with_tail(lake, "t", last).column("message").to_pylist()
    assert len(tailed) == len(set(tailed)) and set(tailed) == expected


def test_a_gap_reseeds_the_state(lake: Lake, tmp_path: Path) -> None:
    dt = ensure_table(lake, "g", UNIFIED_SCHEMA)
    appender = TableAppender(lake, "g", dt)  # no checkpointer: this test feeds the writer
    writer = CheckpointWriter(lake, "g")

    def feed(version: int) -> None:
        writer.feed(version, parse_actions(read_log_file(lake, "g", f"{version:020d}.json")))

    for seq in range(6):
        append(appender, seq, rows(seq * 10, 10), None)
        feed(appender.version())
    first = writer.write(appender.version())
    assert first.seeded and writer.seeds == 1
    for seq in range(6, 9):
        append(appender, seq, rows(seq * 10, 10), None)
        feed(appender.version())
    assert not writer.write(appender.version()).seeded  # fed without a gap: from memory
    assert writer.seeds == 1

    # A commit the writer never hears of (another writer's, which also checkpoints with
    # delta-rs), then more that it does.
    write_deltalake(
        lake.uri("g"), rows(500, 5), mode="append", storage_options=lake.storage_options
    )
    lake.open("g").create_checkpoint()
    appender.refresh()
    unseen = appender.version()
    for seq in range(9, 12):
        append(appender, seq, rows(seq * 10, 10), None)
        feed(appender.version())
    version = appender.version()
    written = writer.write(version)
    # The gap at `unseen` reloaded the state, from delta-rs' checkpoint and the commits after.
    assert written.seeded and writer.seeds == 2
    assert written.adds == 13
    ours = read_log_file(lake, "g", f"{version:020d}.checkpoint.parquet")
    assert content(ours) == content(delta_rs_checkpoint(lake, "g", version, tmp_path))

    # A writer that starts afresh seeds from our checkpoint and writes the same one again.
    again = CheckpointWriter(lake, "g")
    assert again.write(version).seeded
    assert content(read_log_file(lake, "g", f"{version:020d}.checkpoint.parquet")) == content(ours)

    drop_commits_through(lake, "g", version)
    fresh = lake.open("g")
    assert fresh.version() == version and unseen < version
    assert fresh.to_pyarrow_table().num_rows == 125
    assert fresh.transaction_version("w") == 11


def test_a_checkpoint_once_written_is_never_replaced(lake: Lake) -> None:
    """Two writers checkpoint one version: the stream's from memory and a maintenance
    pass's through delta-rs. Whichever comes second keeps the first's file, byte for byte
    (a reader that listed it fails on a replaced file's footer)."""
    dt = ensure_table(lake, "twice", UNIFIED_SCHEMA)
    appender = TableAppender(lake, "twice", dt)
    writer = CheckpointWriter(lake, "twice")
    for seq in range(4):
        append(appender, seq, rows(seq * 10, 10), None)
    first = appender.version()
    name = f"{first:020d}.checkpoint.parquet"

    # delta-rs first (a maintenance pass), then the stream's writer: the writer keeps it.
    maintained = maintain_table(lake, "twice", retention_hours=168, compaction=False)
    assert maintained.checkpoint_version == first
    by_delta_rs = read_log_file(lake, "twice", name)
    written = writer.write(first)
    assert written.kept and written.size == 0
    assert read_log_file(lake, "twice", name) == by_delta_rs

    # The stream's writer first, then a maintenance pass: the pass keeps it.
    for seq in range(4, 6):
        append(appender, seq, rows(seq * 10, 10), None)
    second = appender.version()
    loaded_before = lake.open("twice")  # as a pass that loaded the table just before
    written = writer.write(second)
    assert not written.kept and written.size > 0
    name = f"{second:020d}.checkpoint.parquet"
    from_memory = read_log_file(lake, "twice", name)
    assert not create_checkpoint_once(lake, "twice", loaded_before)
    assert read_log_file(lake, "twice", name) == from_memory
    assert (
        maintain_table(lake, "twice", retention_hours=168, compaction=False).checkpoint_version
        == second
    )
    assert read_log_file(lake, "twice", name) == from_memory
    assert lake.open("twice").to_pyarrow_table().num_rows == 60


def test_a_version_without_actions_goes_to_delta_rs(lake: Lake) -> None:
    dt = ensure_table(lake, "d", UNIFIED_SCHEMA)
    checkpointer = BackgroundCheckpointer(lake, "d", interval=1)
    appender = TableAppender(lake, "d", dt)
    append(appender, 0, rows(0, 5), checkpointer)
    checkpointer.close()
    assert checkpointer.from_memory == [1]

    checkpointer = BackgroundCheckpointer(lake, "d", interval=1)
    write_deltalake(
        lake.uri("d"), rows(100, 5), mode="append", storage_options=lake.storage_options
    )
    checkpointer.committed(2)  # reported as delta-rs writers do: no actions
    checkpointer.close()
    assert checkpointer.written == [2] and checkpointer.from_memory == []
    assert checkpointer.failures == 0
    assert lake.open("d").to_pyarrow_table().num_rows == 10


def test_tables_it_does_not_handle_are_checkpointed_by_delta_rs(lake: Lake) -> None:
    write_deltalake(
        lake.uri("parts"),
        pa.table({"day": ["a", "b"], "n": [1, 2]}),
        partition_by=["day"],
        storage_options=lake.storage_options,
    )
    checkpointer = BackgroundCheckpointer(lake, "parts", interval=1)
    checkpointer.committed(0, parse_actions(read_log_file(lake, "parts", f"{0:020d}.json")))
    checkpointer.close()
    assert checkpointer.written == [0] and checkpointer.from_memory == []
    assert not checkpointer._from_memory  # told once, delta-rs from then on
    assert lake.open("parts").to_pyarrow_table().num_rows == 2


def test_the_state_refuses_what_it_cannot_reconcile() -> None:
    state = TableState()
    add = {"path": "a", "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True}
    with pytest.raises(Unsupported, match="deletion vectors"):
        state.apply({"add": [{**add, "deletionVector": {"storageType": "u"}}]})
    with pytest.raises(Unsupported, match="sidecar"):
        state.apply({"sidecar": [{"path": "x"}]})
    with pytest.raises(Unsupported, match="two actions"):
        state.apply({"add": [add], "remove": [{"path": "a", "dataChange": True}]})
    with pytest.raises(Unsupported, match="size"):
        state.apply({"add": [{**add, "size": None}]})
    state.apply({"add": [add], "txn": [{"appId": "x", "version": 3}]})
    state.apply({"remove": [{"path": "a", "dataChange": True, "deletionTimestamp": 5}]})
    assert state.files == {} and set(state.tombstones) == {"a"}
    state.apply({"add": [add], "txn": [{"appId": "x", "version": 2}]})  # latest txn wins
    assert set(state.files) == {"a"} and state.tombstones == {}
    assert state.txns["x"]["version"] == 2
    assert parse_interval_ms("interval 2 weeks") == 2 * 7 * 86_400_000
    assert parse_interval_ms("interval 10 seconds") == 10_000
    with pytest.raises(Unsupported):
        parse_interval_ms("30 days")


def test_log_cleanup_deletes_what_delta_rs_deletes(tmp_path: Path) -> None:
    """The same expired files go as with delta-rs' cleanup_metadata, on two copies of a
    log whose older half is past the retention."""
    lake = Lake(Settings(storage="local", local_root=tmp_path / "lake", prefix="p"))
    dt = DeltaTable.create(
        lake.uri("c"),
        schema=UNIFIED_SCHEMA,
        configuration={"delta.logRetentionDuration": "interval 60 seconds"},
    )
    for i in range(12):
        write_deltalake(dt, rows(i, 1), mode="append")
        if i in (4, 9):
            dt.create_checkpoint()
    log = Path(lake.uri("c")) / "_delta_log"
    old = time.time() - 3600
    for f in log.iterdir():
        version = int(f.name[:20]) if f.name[:20].isdigit() else None
        if version is not None and version <= 7:
            os.utime(f, (old, old))
    copy = tmp_path / "copy"
    shutil.copytree(lake.uri("c"), copy)  # copy2 keeps the modification times
    before = {p.name for p in log.iterdir()}
    cutoff = int(time.time() * 1000) - 60_000
    deleted = cleanup_expired_logs(lake.object_store, "c", dt.version(), cutoff)
    DeltaTable(str(copy)).cleanup_metadata()
    kept = {p.name for p in log.iterdir()}
    assert kept == {p.name for p in (copy / "_delta_log").iterdir()}
    assert deleted == len(before - kept) == 5  # commits 0-4, behind the checkpoint at 5
    assert lake.open("c").to_pyarrow_table().num_rows == 12


@pytest.mark.spark
def test_spark_reads_a_checkpoint_from_memory(spark, minio_lake: Lake) -> None:  # noqa: F811
    """Delta Spark (`make spark`) takes the table state from our checkpoint alone."""
    lake = minio_lake
    checkpointer = BackgroundCheckpointer(lake, "s", interval=5)
    appender = TableAppender(lake, "s", ensure_table(lake, "s", UNIFIED_SCHEMA))
    for seq in range(14):
        append(appender, seq, rows(seq * 10, 10), checkpointer)
        if seq == 8:
            lake.open("s").optimize.compact()
    checkpointer.close()
    assert checkpointer.from_memory == checkpointer.written
    drop_commits_through(lake, "s", checkpointer.written[-1])
    path = s3a(lake, "s")
    messages = [r["message"] for r in spark.read.format("delta").load(path).collect()]
    assert sorted(messages) == sorted(f"m{i}" for i in range(140))
    # Spark skips an idempotent write whose app transaction the table already holds.
    again = spark.createDataFrame(
        [(0.5, "again", 0, 1)], "timestamp double, message string, time long, diff long"
    )
    again.write.format("delta").mode("append").option("txnAppId", "w").option(
        "txnVersion", 13
    ).save(path)
    assert spark.read.format("delta").load(path).count() == 140
