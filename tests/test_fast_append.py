"""Two-PUT appends (deltabus.delta.append) on real tables, MinIO and local: what they write
reads back through delta-rs and DuckDB, racing writers each land exactly once, and a
table that needs more than a plain append goes to delta-rs."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA
from deltabus.apps.timezones.duck import lake_connection
from deltabus.delta.append import TableAppender, eligible
from deltabus.delta.lake import Lake
from deltabus.delta.parquet_io import DICTIONARY_PAGE_LIMIT, parquet_buffer
from deltabus.delta.tables import ensure_table, meta, metadata
from tests.helpers import unified_rows as rows


def append(appender: TableAppender, seq: int, data: pa.Table, app_id: str = "w") -> bool:
    return appender.append_once(
        data,
        app_id=app_id,
        seq=seq,
        custom_metadata=metadata(seq=seq),
        what="test append",
        markers={f"{app_id}:next": seq + 1},
    )


def test_appends_read_back_through_delta_rs_and_duckdb(lake: Lake):
    dt = ensure_table(lake, "t", UNIFIED_SCHEMA)
    appender = TableAppender(lake, "t", dt)
    assert appender.fast
    for seq in range(5):
        assert append(appender, seq, rows(seq * 10, 10))
    fresh = lake.open("t")
    assert fresh.version() == appender.version() == 5
    assert fresh.transaction_version("w") == 4 and fresh.transaction_version("w:next") == 5
    assert meta(fresh.history(1)[0], "seq") == 4
    stats = pa.table(fresh.get_add_actions(flatten=True)).to_pydict()
    assert sorted(stats["num_records"]) == [10] * 5
    assert min(stats["min.time"]) == 0 and max(stats["max.time"]) == 49
    got = fresh.to_pyarrow_table().sort_by("time")
    assert got.equals(rows(0, 50))
    con = lake_connection(lake, ("t",))  # how the checks and latency assets query
    assert con.execute("SELECT count(*), sum(time) FROM t").fetchone() == (50, sum(range(50)))


def test_racing_writers_each_land_once(minio_lake: Lake):
    lake = minio_lake
    ensure_table(lake, "race", UNIFIED_SCHEMA)
    errors: list[BaseException] = []

    def writer(app_id: str) -> None:
        try:
            appender = TableAppender(lake, "race", lake.open("race"))
            for seq in range(15):
                append(appender, seq, rows(seq, 1), app_id=app_id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    dt = lake.open("race")
    assert dt.version() == 45
    assert all(dt.transaction_version(f"w{i}") == 14 for i in range(3))
    assert dt.to_pyarrow_table().num_rows == 45


def test_a_commit_that_landed_is_not_written_twice(lake: Lake):
    """Two handles of one writer id: the second finds (app id, seq) in the log when its
    version is taken, as a retry after a lost answer does, and writes nothing."""
    ensure_table(lake, "once", UNIFIED_SCHEMA)
    first = TableAppender(lake, "once", lake.open("once"))
    second = TableAppender(lake, "once", lake.open("once"))
    assert append(first, 0, rows(0, 3))
    assert append(second, 0, rows(0, 3)) is False
    assert append(second, 1, rows(3, 3))
    assert lake.open("once").to_pyarrow_table().num_rows == 6


def test_constrained_tables_are_appended_by_delta_rs(lake: Lake):
    dt = ensure_table(lake, "checked", UNIFIED_SCHEMA)
    appender = TableAppender(lake, "checked", dt)
    assert append(appender, 0, rows(0, 2))
    # Another writer adds a check constraint: a plain append would not enforce it.
    other = lake.open("checked")
    other.alter.add_constraint({"time_positive": "time >= 0"})
    bad = rows(0, 1).set_column(2, "time", pa.array([-1], pa.int64()))
    with pytest.raises(DeltaError, match="failed validation"):
        append(appender, 1, bad)
    assert not appender.fast and "constraint" in (appender.reason or "")
    assert append(appender, 1, rows(5, 1))
    assert lake.open("checked").to_pyarrow_table().num_rows == 3


def test_data_files_keep_dictionaries_only_where_they_pay():
    """Unique columns (message ids) give up on a dictionary early instead of building a
    large one; a column of few values (`diff`) stays dictionary-encoded."""
    n = 20_000
    table = pa.table(
        {"message": [f"run-{i}" for i in range(n)], "diff": pa.array([1] * n, pa.int64())}
    )
    written = parquet_buffer(table)
    chunks = pq.ParquetFile(pa.BufferReader(written)).metadata.row_group(0)
    message, diff = chunks.column(0), chunks.column(1)
    # The dictionary page sits between its offset and the first data page's.
    assert message.data_page_offset - message.dictionary_page_offset < 2 * DICTIONARY_PAGE_LIMIT
    assert diff.has_dictionary_page and diff.total_compressed_size < 1_000
    assert pq.read_table(pa.BufferReader(written)).equals(table)


def test_eligibility_reads_the_protocol():
    plain = {"schemaString": '{"type":"struct","fields":[]}', "configuration": {}}
    assert eligible({"minWriterVersion": 4}, plain) is None
    assert "column mapping" in (eligible({"minWriterVersion": 5}, plain) or "")
    assert eligible({"minWriterVersion": 7, "writerFeatures": ["rowTracking"]}, plain)
    assert eligible({"minWriterVersion": 2}, {**plain, "partitionColumns": ["d"]})
    generated = (
        '{"type":"struct","fields":[{"name":"g","type":"long","nullable":true,'
        '"metadata":{"delta.generationExpression":"1"}}]}'
    )
    assert eligible({"minWriterVersion": 4}, {**plain, "schemaString": generated})


def test_other_writers_commits_are_kept(lake: Lake):
    """delta-rs commits between two fast appends: the appender reads them and commits on
    top, and the table holds every row."""
    dt = ensure_table(lake, "mixed", UNIFIED_SCHEMA)
    appender = TableAppender(lake, "mixed", dt)
    assert append(appender, 0, rows(0, 2))
    write_deltalake(lake.open("mixed"), rows(100, 4), mode="append")
    assert append(appender, 1, rows(2, 2))
    table = DeltaTable(lake.uri("mixed"), storage_options=lake.storage_options)
    assert table.version() == 3 and table.to_pyarrow_table().num_rows == 8
