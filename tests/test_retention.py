"""Kafka's retention for streams, on a real MinIO: `retention_s` and `retention_bytes` drop
whole data files at lake maintenance in a commit of `dataChange: false` removes, which no
consumer, transform or ETL reads as deletes; a consumer group whose position fell behind
gets `auto_offset_reset`; vacuum then frees the bytes; `deltabus streams alter` and
`deltabus streams maintain` from the command line."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import obstore
import polars as pl
import pyarrow as pa
import pytest

import deltabus
from deltabus.bus.admin import reset_offsets
from deltabus.bus.tail import DeltaLogTail
from deltabus.delta.lake import Lake
from deltabus.delta.retention import RETENTION_APP_ID, oldest_version
from deltabus.delta.snapshots import DeltaLog, parse_actions
from tests.conftest import lake_env, run_cli
from tests.helpers import read_inputs, read_unified

SCHEMA = pa.schema([("id", pa.int64(), False), ("key", pa.string())])


def produce(bus: deltabus.Bus, stream: str, ids: range, flushes: int = 1) -> None:
    """Send `ids` (keyed by id mod 7) in `flushes` commits per partition."""
    with bus.producer(stream, f"writer-{ids.start}", commit_interval_ms=0) as producer:
        step = max(1, len(ids) // flushes)
        for start in range(ids.start, ids.stop, step):
            for i in range(start, min(start + step, ids.stop)):
                producer.send({"id": i, "key": f"k{i % 7}"})
            producer.flush()


def read_all(consumer: deltabus.Consumer, idle_s: float = 1.5) -> list[deltabus.Batch]:
    """Every batch until none came for `idle_s`."""
    batches, last = [], time.monotonic()
    while time.monotonic() - last < idle_s:
        batch = consumer.poll(0.2)
        if batch is not None:
            batches.append(batch)
            last = time.monotonic()
    return batches


def ids_of(batches: list[deltabus.Batch]) -> list[int]:
    return sorted(i for b in batches for i in b.rows.column("id").to_pylist())


def diffs_of(batches: list[deltabus.Batch]) -> set[int]:
    return {d for b in batches for d in b.rows.column("diff").to_pylist()}


def live_ids(lake: Lake, stream: deltabus.Stream) -> list[int]:
    return sorted(
        i for t in stream.tables for i in lake.open(t).to_pyarrow_table()["id"].to_pylist()
    )


def commit_actions(lake: Lake, table: str, version: int) -> dict:
    raw = DeltaLog(lake.object_store, table).commit(version)
    assert raw is not None, f"{table} version {version} is not in the log"
    return parse_actions(raw)


def objects_under(lake: Lake, prefix: str) -> dict[str, int]:
    return {
        str(meta["path"]): int(meta["size"])
        for chunk in obstore.list(lake.object_store, prefix=f"{prefix}/")
        for meta in chunk
    }


def test_retention_drops_old_files_and_consumers_read_only_what_is_kept(
    minio_lake: Lake,
) -> None:
    bus = deltabus.Bus(minio_lake)
    stream = bus.create_stream(
        "events",
        SCHEMA,
        partitions=2,
        key="key",
        settings=deltabus.StreamSettings(retention_s=2),
    )
    produce(bus, "events", range(0, 100), flushes=3)
    with bus.consumer("events", group="live") as live:  # reads everything before retention
        assert ids_of(read_all(live)) == list(range(100))
    time.sleep(3)  # the first records are now older than retention_s
    produce(bus, "events", range(100, 150))

    (report,) = bus.maintain("events")
    assert report.stream == "events" and report.retention_s == 2
    assert len(report.tables) == 2
    for table in report.tables:
        assert table.retention_files_removed >= 3  # the producer's claim and 3 flushes
        assert table.retention_bytes_removed > 0
        assert table.retention_version is not None
        assert table.oldest_version_kept > 0
        actions = commit_actions(minio_lake, table.table, table.retention_version)
        assert actions["commitInfo"][0]["operation"] == "RETENTION"
        assert actions["commitInfo"][0]["deltabus.retention.oldest_version"] == (
            table.oldest_version_kept
        )
        assert {r["dataChange"] for r in actions["remove"]} == {False}
        assert len(actions["remove"]) == table.retention_files_removed
        assert not actions.get("add") and not actions.get("cdc")
        txns = {t["appId"]: t["version"] for t in actions["txn"]}
        assert txns == {RETENTION_APP_ID: table.oldest_version_kept}
        assert oldest_version(minio_lake, table.table) == table.oldest_version_kept
        # The change data feed (delta-rs) and deltabus' own tail see no rows in it.
        cdf = minio_lake.open(table.table).load_cdf(
            starting_version=table.retention_version, ending_version=table.retention_version
        )
        assert cdf.read_all().num_rows == 0
        tail = DeltaLogTail(minio_lake, table.table)
        tail.start(table.retention_version)
        commit = tail.commit(table.retention_version)
        assert commit is not None and commit.parts == [] and tail.rows(commit) is None

    assert live_ids(minio_lake, stream) == list(range(100, 150))  # the table's snapshot
    with bus.consumer("events", group="fresh") as fresh:  # a new group from the beginning
        batches = read_all(fresh)
    assert ids_of(batches) == list(range(100, 150)) and diffs_of(batches) == {1}
    with bus.consumer("events", group="live") as live:  # across the retention commit
        batches = read_all(live)
    assert ids_of(batches) == list(range(100, 150)) and diffs_of(batches) == {1}


def behind(bus: deltabus.Bus, group: str) -> int:
    """Let `group` read the first of the stream's commits, then commit: its position is
    the next, which retention then drops. Returns that position."""
    with bus.consumer("clicks", group=group, auto_commit=False) as consumer:
        first = consumer.poll(5)
        assert first is not None and ids_of([first]) == list(range(10))
        consumer.commit()
        return first.version + 1


def test_a_group_behind_the_retention_gets_its_auto_offset_reset(
    minio_lake: Lake, caplog: pytest.LogCaptureFixture
) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("clicks", SCHEMA, settings=deltabus.StreamSettings(retention_s=2))
    produce(bus, "clicks", range(0, 30), flushes=3)  # versions of 10 records each
    positions = {g: behind(bus, g) for g in ("g-earliest", "g-latest", "g-error", "g-default")}
    time.sleep(3)
    produce(bus, "clicks", range(100, 110))
    (report,) = bus.maintain("clicks")
    oldest = report.tables[0].oldest_version_kept
    assert all(p < oldest for p in positions.values()), (positions, oldest)

    caplog.set_level(logging.WARNING, logger="deltabus.bus.consumer")
    with bus.consumer("clicks", group="g-earliest", auto_offset_reset="earliest") as consumer:
        batches = read_all(consumer)
    assert ids_of(batches) == list(range(100, 110)) and diffs_of(batches) == {1}
    assert min(b.version for b in batches) >= oldest
    warned = [r.getMessage() for r in caplog.records if "g-earliest" in r.getMessage()]
    assert len(warned) == 1
    for fact in ("table clicks", f"version {positions['g-earliest']}", f"keeps, {oldest}"):
        assert fact in warned[0], warned[0]
    assert "auto_offset_reset=earliest" in warned[0]
    assert bus.describe_group("g-earliest")["partitions"]["clicks"]["lag"] == 0

    for group, base in (("g-latest", 200), ("g-default", 300)):  # Kafka's default: latest
        kwargs = {"auto_offset_reset": "latest"} if group == "g-latest" else {}
        with bus.consumer("clicks", group=group, **kwargs) as consumer:
            assert read_all(consumer, idle_s=1.0) == []  # only what lands from now on
            produce(bus, "clicks", range(base, base + 5))
            assert ids_of(read_all(consumer)) == list(range(base, base + 5))
        warned = [r.getMessage() for r in caplog.records if group in r.getMessage()]
        assert len(warned) == 1 and "auto_offset_reset=latest" in warned[0], warned

    with bus.consumer("clicks", group="g-error", auto_offset_reset="error") as consumer:
        for _ in range(2):  # every poll, until the member seeks
            with pytest.raises(deltabus.OffsetOutOfRangeError) as raised:
                consumer.poll(1)
            error = raised.value
            assert (error.table, error.position, error.oldest) == (
                "clicks",
                positions["g-error"],
                oldest,
            )
            assert "table clicks" in str(error) and f"keeps, {oldest}" in str(error)
            assert "fix:" in str(error)
        consumer.seek("beginning")  # the oldest version retention keeps
        assert ids_of(read_all(consumer))[:10] == list(range(100, 110))
    assert not [r for r in caplog.records if "g-error" in r.getMessage()]  # raised, not logged

    # kafka-consumer-groups --to-earliest: the log start offset, the oldest version kept.
    (reset,) = reset_offsets(minio_lake, "g-reset", [bus.stream("clicks")], "earliest")
    assert (reset.table, reset.after) == ("clicks", oldest)


def test_retention_bytes_keeps_each_partition_under_the_limit(minio_lake: Lake) -> None:
    bus = deltabus.Bus(minio_lake)
    settings = deltabus.StreamSettings(compaction=False)  # the files stay as written
    stream = bus.create_stream("metrics", SCHEMA, partitions=2, key="key", settings=settings)
    produce(bus, "metrics", range(0, 400), flushes=8)
    before = {}
    for table in stream.tables:
        files = pa.table(minio_lake.open(table).get_add_actions(flatten=True))
        before[table] = sorted(
            zip(
                files["modification_time"].to_pylist(),
                files["path"].to_pylist(),
                files["size_bytes"].to_pylist(),
                strict=True,
            )
        )
        assert len(before[table]) >= 8
    sizes = [size for files in before.values() for _, _, size in files]
    limit = 3 * max(sizes) + 10  # room for three files at least, not for all
    altered = bus.alter_stream("metrics", retention_bytes=limit)
    assert altered.settings.retention_bytes == limit and altered.settings.compaction is False

    (report,) = bus.maintain("metrics")
    for result in report.tables:
        files = before[result.table]
        live = pa.table(minio_lake.open(result.table).get_add_actions(flatten=True))
        kept = set(live["path"].to_pylist())
        assert result.live_bytes == sum(live["size_bytes"].to_pylist()) <= limit
        assert result.retention_files_removed == len(files) - len(kept) > 0
        # Whole files, oldest first, no more than needed: the kept ones are the newest, and
        # the newest dropped one would not have fit.
        assert kept == {path for _, path, _ in files[len(files) - len(kept) :]}
        assert result.live_bytes + files[len(files) - len(kept) - 1][2] > limit
    with bus.consumer("metrics", group="reader") as consumer:
        batches = read_all(consumer)
    assert ids_of(batches) == live_ids(minio_lake, stream) and diffs_of(batches) == {1}
    assert 0 < len(ids_of(batches)) < 400


def test_vacuum_frees_the_bytes_retention_removed_after_the_deleted_file_retention(
    minio_lake: Lake,
) -> None:
    lake = Lake(minio_lake.settings.model_copy(update={"deleted_file_retention_s": 10}))
    bus = deltabus.Bus(lake)
    settings = deltabus.StreamSettings(retention_s=2, compaction=False)  # no other removes
    bus.create_stream("logs", SCHEMA, settings=settings)
    produce(bus, "logs", range(0, 60), flushes=3)
    time.sleep(3)
    produce(bus, "logs", range(60, 70))
    objects = objects_under(lake, "logs")
    (first,) = bus.maintain("logs")
    (table,) = first.tables
    assert table.retention_files_removed >= 3 and table.files_vacuumed == 0  # too young
    removed = commit_actions(lake, "logs", table.retention_version)["remove"]
    removed_keys = {f"logs/{r['path']}" for r in removed}
    assert removed_keys <= set(objects_under(lake, "logs"))  # still in storage

    bus.alter_stream("logs", retention_s=None)  # what is left stays from now on
    time.sleep(11)  # past the deleted-file retention
    (second,) = bus.maintain("logs")
    assert second.tables[0].files_vacuumed == len(removed_keys)
    after = objects_under(lake, "logs")
    assert not removed_keys & set(after)
    data = {k: v for k, v in after.items() if "/_delta_log/" not in k}
    data_before = {k: v for k, v in objects.items() if "/_delta_log/" not in k}
    assert len(data) < len(data_before)
    assert sum(data.values()) == sum(data_before.values()) - table.retention_bytes_removed
    assert live_ids(lake, bus.stream("logs")) == list(range(60, 70))


def test_streams_alter_and_maintain_from_the_command_line(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    created = run_cli(
        ["streams", "create", "orders", "--schema", "id:int64!,key:string", "--key", "key",
         "--partitions", "2", "--retention-s", "3600"],
        env,
        tmp_path,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    settings = json.loads(created.stdout)["settings"]
    assert settings["retention_s"] == 3600 and settings["retention_bytes"] is None

    altered = run_cli(
        ["--json", "streams", "alter", "orders", "--retention-bytes", "1000000",
         "--no-retention-s"],
        env,
        tmp_path,
    )  # fmt: skip
    assert altered.returncode == 0, altered.stderr
    recorded = json.loads(altered.stdout)
    assert recorded["settings"]["retention_s"] is None
    assert recorded["settings"]["retention_bytes"] == 1_000_000
    assert recorded["revision"] == 1 and recorded["partitions"] == 2  # the rest as declared
    bus = deltabus.Bus(minio_lake)
    assert bus.stream("orders").settings.retention_bytes == 1_000_000

    contradicting = run_cli(
        ["streams", "alter", "orders", "--retention-s", "5", "--no-retention"], env, tmp_path
    )
    assert contradicting.returncode == 2 and "contradict" in contradicting.stderr

    # A stream's own log retention and checkpoint interval, then back to the lake's.
    own = ["--log-retention-s", "120", "--checkpoint-interval", "7"]
    assert run_cli(["streams", "alter", "orders", *own], env, tmp_path).returncode == 0
    table = bus.stream("orders").tables[0]
    assert bus.stream("orders").settings.checkpoint_interval == 7
    assert (
        minio_lake.open(table).metadata().configuration["delta.logRetentionDuration"]
        == "interval 120 seconds"
    )
    back = ["--lake-log-retention", "--lake-checkpoint-interval"]
    reset = run_cli(["--json", "streams", "alter", "orders", *back], env, tmp_path)
    assert reset.returncode == 0, reset.stderr
    settings = json.loads(reset.stdout)["settings"]
    assert settings["log_retention_s"] is None and settings["checkpoint_interval"] is None
    assert (
        minio_lake.open(table).metadata().configuration["delta.logRetentionDuration"]
        != "interval 120 seconds"
    )
    nothing = run_cli(["streams", "alter", "orders"], env, tmp_path)
    assert nothing.returncode == 2 and "no setting to change" in nothing.stderr

    bus.alter_stream("orders", retention_bytes=1, retention_s=None)  # drop everything kept
    produce(bus, "orders", range(0, 20))
    maintained = run_cli(["--json", "streams", "maintain", "orders"], env, tmp_path)
    assert maintained.returncode == 0, maintained.stderr
    (report,) = json.loads(maintained.stdout)["streams"]
    assert report["stream"] == "orders" and report["retention_bytes"] == 1
    assert [t["table"] for t in report["tables"]] == ["orders-p0", "orders-p1"]
    assert report["files_removed"] == sum(t["retention_files_removed"] for t in report["tables"])
    assert report["files_removed"] >= 2 and report["bytes_removed"] > 0
    assert all(t["live_files"] == 0 for t in report["tables"])

    everything = run_cli(["--json", "streams", "maintain"], env, tmp_path)
    assert everything.returncode == 0, everything.stderr
    assert [s["stream"] for s in json.loads(everything.stdout)["streams"]] == ["orders"]

    for command in (
        ["streams", "maintain", "nope"],
        ["streams", "alter", "nope", "--no-retention"],
    ):
        unknown = run_cli(command, env, tmp_path)
        assert unknown.returncode == 2, unknown.stderr
        assert "no stream 'nope'" in unknown.stderr and "orders" in unknown.stderr
        assert "Traceback" not in unknown.stderr


def test_consume_stops_with_exit_2_when_the_group_fell_behind_and_asked_for_errors(
    minio_lake: Lake, tmp_path: Path
) -> None:
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("clicks", SCHEMA, settings=deltabus.StreamSettings(retention_s=2))
    produce(bus, "clicks", range(0, 30), flushes=3)
    position = behind(bus, "cli")
    time.sleep(3)
    produce(bus, "clicks", range(100, 110))
    (report,) = bus.maintain("clicks")
    oldest = report.tables[0].oldest_version_kept
    args = ["consume", "--stream", "clicks", "--group", "cli", "--idle-exit-s", "2"]
    failed = run_cli([*args, "--auto-offset-reset", "error"], lake_env(minio_lake), tmp_path)
    assert failed.returncode == 2, failed.stderr
    assert failed.stdout == ""
    for fact in ("table clicks", f"version {position}", f"keeps, {oldest}", "fix:"):
        assert fact in failed.stderr, failed.stderr
    earliest = run_cli([*args, "--auto-offset-reset", "earliest"], lake_env(minio_lake), tmp_path)
    assert earliest.returncode == 0, earliest.stderr
    rows = [json.loads(line) for line in earliest.stdout.splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(100, 110))
    assert {r["diff"] for r in rows} == {1}
    assert "auto_offset_reset=earliest" in earliest.stderr


def test_the_time_zone_etl_reads_past_a_retention_commit_without_retractions(
    minio_lake: Lake, tmp_path: Path
) -> None:
    from deltabus.apps.timezones.contracts import INPUT_TABLES
    from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer

    env = lake_env(minio_lake)
    config = dict(rate=2000, count=200, commit_interval=0.05, seed=3)
    TimezoneProducer(minio_lake, ProducerConfig(**config, run_id="before")).run()  # type: ignore[arg-type]
    first = run_cli(["--json", "etl", "--mode", "bounded"], env, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    bus = deltabus.Bus(minio_lake)
    for table in INPUT_TABLES:
        bus.alter_stream(table, retention_s=3)
    time.sleep(4)
    TimezoneProducer(minio_lake, ProducerConfig(**config, run_id="after")).run()  # type: ignore[arg-type]
    produced = set(read_inputs(minio_lake)["message"])
    assert len(produced) == 400
    removed = 0
    for table in INPUT_TABLES:
        (report,) = bus.maintain(table)
        removed += report.tables[0].retention_files_removed
    assert removed > 0
    assert len(read_inputs(minio_lake)) < 400  # the first run's records were dropped

    second = run_cli(["--json", "etl", "--mode", "bounded"], env, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    unified = read_unified(minio_lake)
    assert unified["diff"].to_list() == [1] * unified.height  # no retraction
    assert unified.height == 400 and set(unified["message"]) == produced
    assert unified.group_by("message").len().filter(pl.col("len") > 1).height == 0


def test_retention_settings_are_recorded_and_older_declarations_read_as_none(
    local_lake: Lake,
) -> None:
    bus = deltabus.Bus(local_lake)
    settings = deltabus.StreamSettings(retention_s=86_400, retention_bytes=10**9)
    declared = bus.create_stream("orders", SCHEMA, settings=settings)
    assert bus.stream("orders").settings == settings
    assert declared.record()["settings"]["retention_s"] == 86_400

    older = declared.record()
    for name in ("retention_s", "retention_bytes"):  # as declared before they existed
        del older["settings"][name]
    read = deltabus.Stream.from_record(older, 0).settings
    assert (read.retention_s, read.retention_bytes) == (None, None)

    assert bus.alter_stream("orders", retention_s=86_400).revision == 0  # nothing changed
    altered = bus.alter_stream("orders", retention_bytes=None, compaction=False)
    assert altered.revision == 1 and altered.schema == declared.schema
    assert altered.settings == deltabus.StreamSettings(retention_s=86_400, compaction=False)
    assert bus.create_stream("orders", SCHEMA).settings == altered.settings  # kept
    for wrong in ({"retention_s": 0}, {"retention_bytes": -5}, {"retention_s": 1.5}):
        with pytest.raises(deltabus.ConfigError, match="positive integer"):
            bus.alter_stream("orders", **wrong)
    with pytest.raises(deltabus.ConfigError, match="not a stream setting"):
        bus.alter_stream("orders", partitions=2)
    with pytest.raises(deltabus.ConfigError, match="no stream 'nope'"):
        bus.alter_stream("nope", retention_s=5)
    with pytest.raises(deltabus.ConfigError, match="auto_offset_reset"):
        bus.consumer("orders", group="g", auto_offset_reset="smallest")
    assert bus.stream("orders").revision == 1  # refusals recorded nothing


def test_a_slow_stream_compacted_every_pass_still_ages_out(minio_lake: Lake) -> None:
    """Compaction under a retention by time keeps files of different time segments apart,
    so a stream whose history fits in one file does not merge it, pass after pass, into a
    file as new as its newest record, which retention would never drop."""
    bus = deltabus.Bus(minio_lake)
    bus.create_stream("slow", SCHEMA, settings=deltabus.StreamSettings(retention_s=2))
    produce(bus, "slow", range(0, 10), flushes=2)
    for k in range(3):  # a pass every 1.1 s, each after two more small commits
        time.sleep(1.1)
        produce(bus, "slow", range(100 + 10 * k, 110 + 10 * k), flushes=2)
        bus.maintain("slow")
    kept = live_ids(minio_lake, bus.stream("slow"))
    assert 0 not in kept and 120 in kept, kept  # over 3 s old: dropped; the newest: kept
    (table,) = bus.stream("slow").tables
    assert oldest_version(minio_lake, table) > 0
