"""Inputs written by other Delta writers while a continuous ETL runs (delta-rs here, Delta
Spark in test_spark_interop.py): deletes, updates, merges, partitioned tables, schema
changes, protocol features. Real MinIO, real Delta logs, real Pathway ETL process.

Each scenario ends with timezone_unified's net content (sum of diff per row) equal to an
independent recomputation: the inputs' current content read with deltalake, each valid
row's `date` turned into epoch milliseconds by the standard library.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, TableFeatures, write_deltalake

from deltabus.apps.timezones.contracts import INPUT_TABLES, REJECTS_TABLE, UNIFIED_TABLE
from deltabus.apps.timezones.etl.positions import position_marker
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.delta.change_plan import plan_changes
from deltabus.delta.deletion_vectors import decode_roaring_array, dv_relative_path, z85_decode
from deltabus.delta.lake import Lake
from deltabus.delta.table_schema import TableState, parse_partition_value
from tests.conftest import lake_env
from tests.helpers import etl_process, read_table, wait_for_file

DATE_FORMAT = "%Y-%m-%d %H:%M:%S.%f %z"
CONTRACT = ("date", "message")
CDF = {"delta.enableChangeDataFeed": "true"}


# -- the independent recomputation ---------------------------------------------------------


def current_content(lake: Lake, table: str) -> pa.Table:
    """The table's current rows, as deltalake reads them (deletion vectors, mapping)."""
    dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
    return pa.table(dt.scan())


def expected_net(
    lake: Lake, read: Callable[[Lake, str], pa.Table] = current_content
) -> dict[str, float]:
    """message -> epoch ms for every row of the inputs' current content that the input
    contract accepts (both columns set, no value in any other column)."""
    out: dict[str, float] = {}
    for table in INPUT_TABLES:
        if not lake.exists(table):
            continue
        data = read(lake, table)
        extra = [c for c in data.column_names if c not in CONTRACT]
        for row in data.to_pylist():
            if row.get("date") is None or row.get("message") is None:
                continue
            if any(row[c] is not None for c in extra):
                continue
            assert row["message"] not in out, f"message {row['message']} twice in the inputs"
            out[row["message"]] = datetime.strptime(row["date"], DATE_FORMAT).timestamp() * 1000
    return out


def unified_net(lake: Lake) -> pl.DataFrame:
    """(message, timestamp, copies) of timezone_unified's net content."""
    unified = read_table(lake, UNIFIED_TABLE)
    return (
        unified.group_by("message", "timestamp")
        .agg(pl.col("diff").sum().alias("copies"))
        .filter(pl.col("copies") != 0)
    )


def net_mismatch(lake: Lake, expected: dict[str, float]) -> str | None:
    """What differs between the unified net content and `expected`; None when equal."""
    if not lake.exists(UNIFIED_TABLE):
        return "no unified table yet"
    net = unified_net(lake)
    wrong = net.filter(pl.col("copies") != 1)
    if wrong.height:
        return f"{wrong.height} rows with net copies != 1: {wrong.head(5).to_dicts()}"
    if net["message"].n_unique() != net.height:
        twice = net.filter(pl.col("message").is_duplicated()).sort("message")
        return f"messages with two timestamps: {twice.head(6).to_dicts()}"
    got = dict(zip(net["message"].to_list(), net["timestamp"].to_list(), strict=True))
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        return (
            f"{len(missing)} expected messages missing (e.g. {missing[:5]}), "
            f"{len(extra)} unexpected (e.g. {extra[:5]})"
        )
    off = [m for m, ts in expected.items() if abs(got[m] - ts) > 1e-3]
    if off:
        return f"{len(off)} wrong timestamps, e.g. {[(m, got[m], expected[m]) for m in off[:3]]}"
    return None


def wait_for_net(
    lake: Lake,
    etl: subprocess.Popen | None,
    expected: dict[str, float] | None = None,
    timeout: float = 90,
    read: Callable[[Lake, str], pa.Table] = current_content,
) -> dict[str, float]:
    """Wait until the unified net content equals the recomputation from the inputs."""
    expected = expected_net(lake, read) if expected is None else expected
    deadline = time.monotonic() + timeout
    while (problem := net_mismatch(lake, expected)) is not None:
        if etl is not None and etl.poll() is not None:
            pytest.fail(f"ETL exited {etl.returncode}: {etl.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"unified net content still wrong: {problem}"
        time.sleep(0.3)
    return expected


# -- running the ETL -----------------------------------------------------------------------


def start_etl(lake: Lake, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    ready = tmp_path / f"ready-{uuid.uuid4().hex[:8]}"
    etl = etl_process(
        lake_env(lake) | env, tmp_path, "--mode", "continuous", "--ready-file", str(ready)
    )
    wait_for_file(ready, etl)
    return etl


def stop_etl(etl: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM (if still running) and wait: (exit status, stderr)."""
    if etl.poll() is None:
        etl.send_signal(signal.SIGTERM)
    _, stderr = etl.communicate(timeout=120)
    return etl.returncode, stderr


def wait_for_exit(etl: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, stderr = etl.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        etl.kill()
        _, stderr = etl.communicate()
        pytest.fail(f"the ETL did not stop within {timeout}s: {stderr[-3000:]}")
    return etl.returncode, stderr


def produce(lake: Lake, count: int = 1500, run_id: str = "fw") -> None:
    config = ProducerConfig(rate=20_000, count=count, commit_interval=0.05, run_id=run_id)
    assert TimezoneProducer(lake, config).run().messages == count


def delta(lake: Lake, table: str) -> DeltaTable:
    return DeltaTable(lake.uri(table), storage_options=lake.storage_options)


def rows(prefix: str, n: int, dates: int | None = None, offset: str = "-0500") -> pa.Table:
    """`n` contract rows; with `dates`, only that many distinct dates (partition values)."""
    base = datetime(2026, 3, 8, 1, 59, 0)
    stamps = [base + timedelta(milliseconds=37 * (i % dates if dates else i)) for i in range(n)]
    return pa.table(
        {
            "date": [s.strftime("%Y-%m-%d %H:%M:%S.%f ") + offset for s in stamps],
            "message": [f"{prefix}-{i}" for i in range(n)],
        }
    )


def retractions(lake: Lake) -> int:
    return read_table(lake, UNIFIED_TABLE).filter(pl.col("diff") < 0).height


# -- scenarios with delta-rs -----------------------------------------------------------------


def test_delete_rewrites_file_without_duplicates(minio_lake: Lake, tmp_path: Path) -> None:
    """DeltaTable.delete rewrites the file: only the deleted rows are retracted."""
    produce(minio_lake)
    etl = start_etl(minio_lake, tmp_path)
    wait_for_net(minio_lake, etl)
    before = read_table(minio_lake, UNIFIED_TABLE).height
    assert before == 1500

    metrics = delta(minio_lake, "timezone1").delete("message LIKE '%3'")
    deleted = metrics["num_deleted_rows"]
    assert deleted > 50 and metrics["num_copied_rows"] > 300  # a real rewrite
    expected = wait_for_net(minio_lake, etl)
    assert len(expected) == 1500 - deleted
    # The survivors of the rewritten file are not emitted again.
    unified = read_table(minio_lake, UNIFIED_TABLE)
    assert unified.height == 1500 + deleted
    assert retractions(minio_lake) == deleted

    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    assert net_mismatch(minio_lake, expected) is None


def test_update_changes_dates_and_messages(
    minio_lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeltaTable.update: pre-images retracted, post-images inserted, in one commit; the
    readers of timezone_unified (CSV, DuckDB, checks, latency) honour the retractions."""
    produce(minio_lake)
    etl = start_etl(minio_lake, tmp_path)
    wait_for_net(minio_lake, etl)

    dt = delta(minio_lake, "timezone2")
    moved = dt.update(
        updates={"date": "'2026-07-14 12:00:00.250000 +0200'"}, predicate="message LIKE '%5'"
    )["num_updated_rows"]
    renamed = dt.update(
        updates={"message": "concat(message, '-renamed')"}, predicate="message LIKE '%7'"
    )["num_updated_rows"]
    assert moved > 50 and renamed > 50
    expected = wait_for_net(minio_lake, etl)
    assert sum(m.endswith("-renamed") for m in expected) == renamed
    assert sum(ts == 1784023200250.0 for ts in expected.values()) == moved
    assert retractions(minio_lake) == moved + renamed

    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    assert_readers_honour_diff(minio_lake, tmp_path, monkeypatch, expected, renamed)


def assert_content_checks_pass(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Dagster checks `no_message_lost` and `no_duplicate_message` pass (net content)."""
    from dagster_duckdb import DuckDBResource

    from assets.pipeline.checks import evaluate_checks
    from resources.lake import LakeResource
    from tests.conftest import use_lake_env

    use_lake_env(monkeypatch, lake)
    duck = DuckDBResource(database=":memory:")
    names = ["no_message_lost", "no_duplicate_message"]
    for result in evaluate_checks(LakeResource().lake(), duck, names):
        assert result.passed, (result.check_name, result.description)


def assert_readers_honour_diff(
    lake: Lake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    expected: dict[str, float],
    renamed: int,
) -> None:
    from deltabus.apps.timezones.duck import UNIFIED_NET_VIEW, lake_connection
    from deltabus.apps.timezones.latency import unified_samples
    from deltabus.apps.timezones.results import export_results

    unified = read_table(lake, UNIFIED_TABLE)
    # The CSV: the changelog by default, the net content on request.
    log_rows = export_results(lake, tmp_path / "log.csv")
    assert log_rows == unified.height
    changelog = pl.read_csv(tmp_path / "log.csv")
    assert changelog["diff"].sum() == len(expected)
    assert export_results(lake, tmp_path / "net.csv", net=True) == len(expected)
    net = pl.read_csv(tmp_path / "net.csv")
    assert set(net["message"]) == set(expected) and net["diff"].to_list() == [1] * len(expected)
    # DuckDB: the net view.
    con = lake_connection(lake, (UNIFIED_TABLE,))
    assert con.execute(f'SELECT count(*) FROM "{UNIFIED_NET_VIEW}"').fetchone()[0] == len(expected)
    assert_content_checks_pass(lake, monkeypatch)
    # Latency: one sample per message, at its first insertion (a renamed message is a
    # second message; its pre-image's sample stays).
    samples = unified_samples(lake)
    assert samples.num_rows == 1500 + renamed
    first = unified.filter(pl.col("diff") > 0).group_by("message").agg(pl.col("time").min())
    by_message = dict(zip(first["message"].to_list(), first["time"].to_list(), strict=True))
    processed = dict(
        zip(samples["message"].to_pylist(), samples["processed_ms"].to_pylist(), strict=True)
    )
    assert processed == {m: float(t) for m, t in by_message.items()}


def test_merge_after_restart(minio_lake: Lake, tmp_path: Path) -> None:
    """MERGE (update, delete, insert) committed while the ETL was stopped; it resumes."""
    produce(minio_lake)
    etl = start_etl(minio_lake, tmp_path)
    wait_for_net(minio_lake, etl)
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]

    dt = delta(minio_lake, "timezone1")
    present = pl.from_arrow(dt.to_pyarrow_table())["message"].sort().to_list()
    update, remove = present[:40], present[40:70]
    source = pa.table(
        {
            "message": update + remove + [f"merged-{i}" for i in range(25)],
            "date": ["2026-01-02 03:04:05.678901 -0500"] * (len(update) + len(remove) + 25),
            "op": ["u"] * len(update) + ["d"] * len(remove) + ["i"] * 25,
        }
    )
    (
        dt.merge(source, "t.message = s.message", source_alias="s", target_alias="t")
        .when_matched_update(updates={"date": "s.date"}, predicate="s.op = 'u'")
        .when_matched_delete(predicate="s.op = 'd'")
        .when_not_matched_insert(updates={"date": "s.date", "message": "s.message"})
        .execute()
    )
    # More plain appends after the merge, by the producer, with a new run.
    produce(minio_lake, count=300, run_id="fw-after")

    etl = start_etl(minio_lake, tmp_path)
    expected = wait_for_net(minio_lake, etl)
    assert len(expected) == 1500 - 30 + 25 + 300
    assert all(f"merged-{i}" in expected for i in range(25))
    assert not set(remove) & set(expected)
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]


def test_partitioned_by_contract_columns(minio_lake: Lake, tmp_path: Path) -> None:
    """Tables partitioned by `date` and by `message`: values rebuilt from the log."""
    etl = start_etl(minio_lake, tmp_path)  # waits for the tables to be created
    by_date = rows("p1", 200, dates=12)
    write_deltalake(
        minio_lake.uri("timezone1"),
        by_date,
        partition_by=["date"],
        configuration=CDF,
        storage_options=minio_lake.storage_options,
    )
    write_deltalake(
        minio_lake.uri("timezone2"),
        rows("p2", 40, offset="+0100"),
        partition_by=["message"],
        configuration=CDF,
        storage_options=minio_lake.storage_options,
    )
    expected = wait_for_net(minio_lake, etl)
    assert len(expected) == 240

    later = rows("p1b", 60, dates=5)
    write_deltalake(
        minio_lake.uri("timezone1"),
        later,
        mode="append",
        partition_by=["date"],
        storage_options=minio_lake.storage_options,
    )
    one_date = by_date["date"][3].as_py()
    delta(minio_lake, "timezone1").delete(f"date = '{one_date}'")  # whole partition
    delta(minio_lake, "timezone2").delete("message = 'p2-7'")
    delta(minio_lake, "timezone2").update(
        updates={"date": "'2026-05-01 10:00:00.000001 +0100'"}, predicate="message = 'p2-8'"
    )
    expected = wait_for_net(minio_lake, etl)
    in_partition = (by_date["date"].to_pylist() + later["date"].to_pylist()).count(one_date)
    assert in_partition > 20
    assert len(expected) == 240 + 60 - in_partition - 1
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]


def test_schema_change_new_column(minio_lake: Lake, tmp_path: Path) -> None:
    """A column added mid-stream: rows with a value there are rejected, the rest flow."""
    produce(minio_lake)
    etl = start_etl(minio_lake, tmp_path)
    wait_for_net(minio_lake, etl)

    extra = rows("sc", 80).append_column(
        "note", pa.array([None if i % 2 else f"n{i}" for i in range(80)], pa.string())
    )
    write_deltalake(
        minio_lake.uri("timezone1"),
        extra,
        mode="append",
        schema_mode="merge",
        storage_options=minio_lake.storage_options,
    )
    # A change under the new schema: old rows (note null) and new rows deleted.
    delta(minio_lake, "timezone1").delete("message LIKE '%1'")
    expected = wait_for_net(minio_lake, etl)
    assert sum(m.startswith("sc-") for m in expected) == 40 - 8  # odd rows, minus "%1"
    rejects = read_table(minio_lake, REJECTS_TABLE)
    noted = rejects.filter(pl.col("reason").str.contains("note"))
    assert noted.height == 40, rejects.head(5).to_dicts()
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]


# -- refusals: exit status 2, nothing of the version written, position kept -------------------


def recorded_position(lake: Lake, table: str) -> int:
    dt = delta(lake, UNIFIED_TABLE)
    return dt.transaction_version(position_marker(table)) or -1


def test_change_without_cdf_stops_then_skip_setting(minio_lake: Lake, tmp_path: Path) -> None:
    plain = rows("nc", 300)
    write_deltalake(  # no change data feed
        minio_lake.uri("timezone1"), plain, storage_options=minio_lake.storage_options
    )
    write_deltalake(
        minio_lake.uri("timezone2"),
        rows("cdf", 50, offset="+0100"),
        configuration=CDF,
        storage_options=minio_lake.storage_options,
    )
    etl = start_etl(minio_lake, tmp_path)
    wait_for_net(minio_lake, etl)
    unified_before = read_table(minio_lake, UNIFIED_TABLE).height

    dt = delta(minio_lake, "timezone1")
    dt.delete("message LIKE '%3'")
    change_version = dt.version()
    status, stderr = wait_for_exit(etl)
    assert status == 2, stderr[-3000:]
    assert f"timezone1 version {change_version} (DELETE)" in stderr
    assert "change data feed" in stderr and "DELTABUS_SKIP_CHANGE_COMMITS" in stderr
    assert read_table(minio_lake, UNIFIED_TABLE).height == unified_before
    assert recorded_position(minio_lake, "timezone1") < change_version

    # A restart stops at the same place: nothing was skipped silently.
    again = etl_process(lake_env(minio_lake), tmp_path, "--mode", "continuous")
    status, stderr = wait_for_exit(again)
    assert status == 2 and f"version {change_version}" in stderr, stderr[-3000:]

    # Rows appended after the change, then the explicit setting: the change commit is
    # skipped whole (its deletions never reach the output), later rows flow.
    write_deltalake(
        minio_lake.uri("timezone1"),
        rows("nc-later", 30),
        mode="append",
        storage_options=minio_lake.storage_options,
    )
    etl = start_etl(minio_lake, tmp_path, DELTABUS_SKIP_CHANGE_COMMITS="true")
    deleted = {m for m in plain["message"].to_pylist() if m.endswith("3")}
    expected = expected_net(minio_lake)
    expected.update(
        {
            r["message"]: datetime.strptime(r["date"], DATE_FORMAT).timestamp() * 1000
            for r in plain.to_pylist()
            if r["message"] in deleted
        }
    )
    wait_for_net(minio_lake, etl, expected)
    status, stderr = stop_etl(etl)
    assert status == 0, stderr[-3000:]
    assert f"timezone1 version {change_version} (DELETE) skipped" in stderr


def test_protocol_features_checked_mid_stream(minio_lake: Lake, tmp_path: Path) -> None:
    produce(minio_lake, count=600)
    etl = start_etl(minio_lake, tmp_path)
    wait_for_net(minio_lake, etl)

    # A supported reader feature arrives: the ETL goes on.
    delta(minio_lake, "timezone1").alter.add_feature(
        TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )
    assert "deletionVectors" in (delta(minio_lake, "timezone1").protocol().reader_features or [])
    write_deltalake(
        minio_lake.uri("timezone1"),
        rows("dv", 20),
        mode="append",
        storage_options=minio_lake.storage_options,
    )
    wait_for_net(minio_lake, etl)
    unified_before = read_table(minio_lake, UNIFIED_TABLE).height

    # An unsupported one: the ETL stops with the table, version and feature named.
    dt = delta(minio_lake, "timezone2")
    dt.alter.add_feature(TableFeatures.VariantType, allow_protocol_versions_increase=True)
    version = dt.version()
    status, stderr = wait_for_exit(etl)
    assert status == 2, stderr[-3000:]
    assert f"timezone2 version {version} requires Delta reader feature 'variantType'" in stderr
    assert "fix:" in stderr and "resumes right here" in stderr
    assert read_table(minio_lake, UNIFIED_TABLE).height == unified_before
    assert recorded_position(minio_lake, "timezone2") < version


def test_unsupported_protocol_refused_on_start(minio_lake: Lake, tmp_path: Path) -> None:
    """A table already past what the tail reads is refused before any of its rows."""
    write_deltalake(
        minio_lake.uri("timezone1"),
        rows("st", 50),
        configuration=CDF,
        storage_options=minio_lake.storage_options,
    )
    delta(minio_lake, "timezone1").alter.add_feature(
        TableFeatures.V2Checkpoint, allow_protocol_versions_increase=True
    )
    etl = etl_process(lake_env(minio_lake), tmp_path, "--mode", "continuous")
    status, stderr = wait_for_exit(etl)
    assert status == 2, stderr[-3000:]
    assert "timezone1 version 1 requires Delta reader feature 'v2Checkpoint'" in stderr
    unified = read_table(minio_lake, UNIFIED_TABLE) if minio_lake.exists(UNIFIED_TABLE) else None
    assert unified is None or unified.height == 0


# -- the protocol pieces, against the protocol's own examples ---------------------------------


def test_deletion_vector_examples_from_the_protocol() -> None:
    inline = z85_decode("wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L")[:40]
    assert decode_roaring_array(inline).tolist() == [3, 4, 7, 11, 18, 29]
    on_disk = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^"}
    assert (
        dv_relative_path(on_disk) == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )


def _roaring32(values: np.ndarray, runs: bool) -> bytes:
    """Encode sorted 32-bit values in the portable Roaring format (RoaringFormatSpec),
    array / bitmap containers, or run containers for all when `runs`."""
    keys = np.unique(values >> 16)
    header, bodies = [], []
    for key in keys:
        low = (values[(values >> 16) == key] & 0xFFFF).astype(np.int64)
        header.append((int(key), len(low) - 1))
        if runs:
            breaks = np.flatnonzero(np.diff(low) != 1) + 1
            starts = np.concatenate(([0], breaks))
            ends = np.concatenate((breaks, [len(low)]))
            pairs = np.stack([low[starts], ends - starts - 1], axis=1).astype("<u2")
            bodies.append(np.uint16(len(pairs)).tobytes() + pairs.tobytes())
        elif len(low) <= 4096:
            bodies.append(low.astype("<u2").tobytes())
        else:
            bits = np.zeros(65536, np.uint8)
            bits[low] = 1
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    n = len(keys)
    head = np.array(header, "<u2").tobytes()
    if runs:
        flags = np.packbits(np.ones(n, np.uint8), bitorder="little").tobytes()
        out = np.uint32(12347 | ((n - 1) << 16)).tobytes() + flags + head
        if n < 4:
            return out + b"".join(bodies)
    else:
        out = np.uint32(12346).tobytes() + np.uint32(n).tobytes() + head
    offsets, pos = [], len(out) + 4 * n
    for body in bodies:
        offsets.append(pos)
        pos += len(body)
    return out + np.array(offsets, "<u4").tobytes() + b"".join(bodies)


@pytest.mark.parametrize("runs", [False, True])
def test_roaring_containers_decode(runs: bool) -> None:
    rng = np.random.default_rng(7)
    sparse = rng.choice(60_000, 300, replace=False)  # array container
    dense = 70_000 + rng.choice(65_000, 9_000, replace=False)  # bitmap container
    ranges = np.concatenate([np.arange(200_000, 203_000), np.arange(210_000, 210_010)])
    values = np.unique(np.concatenate([sparse, dense, ranges])).astype(np.uint64)
    high = np.uint64(5) << np.uint64(32)  # a second 32-bit bucket
    data = (
        np.int32(1681511377).tobytes()
        + np.int64(2).tobytes()
        + np.uint32(0).tobytes()
        + _roaring32(values.astype(np.uint32), runs)
        + np.uint32(5).tobytes()
        + _roaring32(values[:50].astype(np.uint32), runs)
    )
    decoded = decode_roaring_array(data)
    assert decoded.tolist() == values.tolist() + (values[:50] | high).tolist()


def test_partition_value_serialisation() -> None:
    assert parse_partition_value("2026-03-08 01:59:59.000000 -0500", "string") == (
        "2026-03-08 01:59:59.000000 -0500"
    )
    assert parse_partition_value("", "string") is None
    assert parse_partition_value(None, "long") is None
    assert parse_partition_value("-12", "integer") == -12
    assert parse_partition_value("1.5", "double") == 1.5
    assert parse_partition_value("true", "boolean") is True
    assert str(parse_partition_value("2026-03-08", "date")) == "2026-03-08"
    utc = parse_partition_value("1970-01-01 00:00:01.5", "timestamp")
    assert utc.timestamp() == 1.5
    iso = parse_partition_value("1970-01-01T00:00:01.500000Z", "timestamp")
    assert iso == utc
    assert parse_partition_value("2026-03-08 01:59:59", "timestamp_ntz").tzinfo is None
    assert str(parse_partition_value("12.340", "decimal(10,3)")) == "12.340"


def _state(cdf: bool) -> TableState:
    schema = (
        '{"type":"struct","fields":[{"name":"date","type":"string","nullable":true,"metadata":{}}]}'
    )
    return TableState(
        {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"]},
        {
            "schemaString": schema,
            "partitionColumns": [],
            "configuration": {"delta.enableChangeDataFeed": str(cdf).lower()},
        },
    )


def test_change_plans_follow_the_protocol() -> None:
    dv1 = {"storageType": "i", "pathOrInlineDv": "a", "sizeInBytes": 1, "cardinality": 1}
    dv2 = {"storageType": "i", "pathOrInlineDv": "b", "sizeInBytes": 1, "cardinality": 2}
    add = {"path": "f.parquet", "dataChange": True, "deletionVector": dv2}
    remove = {"path": "f.parquet", "dataChange": True, "deletionVector": dv1}
    # A DELETE with deletion vectors: the rows newly hidden, whatever the change data feed.
    for cdf in (False, True):
        plan = plan_changes({"add": [add], "remove": [remove]}, _state(cdf))
        assert plan.unresolvable is None
        assert [(p.kind, p.diff, p.dv, p.minus) for p in plan.parts] == [
            ("dv", -1, dv2, dv1),
            ("dv", 1, dv1, dv2),
        ]
    # Change data files win over adds and removes.
    cdc = {"path": "_change_data/c.parquet"}
    plan = plan_changes({"add": [add], "remove": [remove], "cdc": [cdc]}, _state(False))
    assert [(p.kind, p.action) for p in plan.parts] == [("cdc", cdc)]
    # A whole file removed: deleted rows with the feed on, unresolvable without it.
    whole = {"path": "g.parquet", "dataChange": True}
    assert plan_changes({"remove": [whole]}, _state(True)).unresolvable is None
    assert plan_changes({"remove": [whole]}, _state(False)).unresolvable
    # Compaction changes nothing.
    moved = {"path": "h.parquet", "dataChange": False}
    assert (
        plan_changes(
            {"add": [moved], "remove": [dict(whole, dataChange=False)]}, _state(False)
        ).parts
        == []
    )


def test_snapshot_from_checkpoint_and_commits(local_lake: Lake) -> None:
    """Table state as of a version: checkpoint + later commits, as deltalake sees it."""
    from deltabus.delta.snapshots import DeltaLog, snapshot_at

    uri = local_lake.uri("timezone1")
    write_deltalake(uri, rows("a", 10), configuration=CDF)
    for i in range(4):
        write_deltalake(uri, rows(f"b{i}", 5), mode="append")
    DeltaTable(uri).create_checkpoint()  # at version 4
    DeltaTable(uri).delete("message = 'a-3'")  # version 5: a rewrite
    write_deltalake(uri, rows("c", 5), mode="append", schema_mode="merge")
    delta_log = DeltaLog(local_lake.object_store, "timezone1")
    for version in (3, 4, 5, 6):
        snapshot = snapshot_at(delta_log, version, files=True)
        assert snapshot is not None and snapshot.state is not None
        assert snapshot.state.cdf_enabled
        live = pa.table(DeltaTable(uri, version=version).get_add_actions(flatten=True))
        assert sorted(snapshot.files or {}) == sorted(live["path"].to_pylist()), version


def test_source_sends_each_version_whole_and_in_order(local_lake: Lake) -> None:
    """Positions advance with the highest version sent: a version with retractions only
    must not go out after a later one, and a version's rows go out in one Pathway row."""
    import threading

    from deltabus.apps.timezones.etl.rejects import RejectsWriter
    from deltabus.apps.timezones.etl.source import DeltaTailSubject
    from deltabus.bus.tail import Commit

    def version(v: int, diffs: list[int]) -> pa.Table:
        n = len(diffs)
        return pa.table(
            {
                "date": ["2026-03-08 01:59:59.000000 -0500"] * n,
                "message": [f"v{v}-{i}" for i in range(n)],
                "_diff": pa.array(diffs, pa.int64()),
                "_commit_version": pa.array([v] * n, pa.int64()),
                "_commit_timestamp": pa.array([0] * n, pa.int64()).cast(pa.timestamp("ms")),
            }
        )

    tables = {4: version(4, [1, -1]), 5: version(5, [-1, -1]), 6: version(6, [1])}

    class Tail:
        skipped_change_commits = 0
        skipped_files = 0

        def rows(self, commit: Commit) -> pa.Table:
            return tables[commit.version]

    sent: list[tuple[int, list[int]]] = []

    class Recording(DeltaTailSubject):
        def next(self, **values) -> None:  # type: ignore[override]
            sent.append((values["version"], values["rows"].value["diff"].to_pylist()))

    subject = Recording(
        local_lake,
        "timezone1",
        4,
        bounded=False,
        expected_producers=1,
        poll_interval=0.1,
        stop=threading.Event(),
        rejects=RejectsWriter(local_lake),
        skip_change_commits=False,
    )
    subject.emit(Tail(), [Commit(v, {}) for v in (4, 5, 6)])  # type: ignore[arg-type]
    assert sent == [(4, [1, -1]), (5, [-1, -1]), (6, [1])]
    assert subject.stats.retractions == 3 and subject.sent_version == 6
