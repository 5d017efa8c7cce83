"""Vacuum's paced deletes (deltabus.delta.vacuum) against the real store: at most a
second's worth of objects a bulk request, spread by the configured rate, every object
gone in the end; and maintenance's vacuum going through them."""

from __future__ import annotations

import obstore

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA
from deltabus.delta.append import TableAppender
from deltabus.delta.lake import Lake
from deltabus.delta.maintenance import maintain_table
from deltabus.delta.tables import ensure_table
from deltabus.delta.vacuum import delete_paced
from tests.helpers import unified_rows


def _put(lake: Lake, n: int) -> list[str]:
    keys = [f"junk/o-{i:03d}" for i in range(n)]
    for key in keys:
        obstore.put(lake.object_store, key, b"x")
    return keys


def _left(lake: Lake) -> int:
    return sum(len(chunk) for chunk in obstore.list(lake.object_store, prefix="junk/"))


def test_deletes_are_spread_a_second_at_a_time(lake: Lake) -> None:
    """25 objects at 10 a second: two waits, after 10 and after 20 deletes, due 1 s and
    2 s after the start; then every object is gone."""
    keys = _put(lake, 25)
    waits: list[tuple[float, int]] = []
    delete_paced(lake, keys, 10, "test", sleep=lambda s: waits.append((s, _left(lake))))
    assert [left for _, left in waits] == [15, 5]
    assert 0.5 < waits[0][0] <= 1.0 and 1.5 < waits[1][0] <= 2.0
    assert _left(lake) == 0


def test_unpaced_deletes_never_wait(lake: Lake) -> None:
    keys = _put(lake, 1500)
    waits: list[float] = []
    delete_paced(lake, keys, 0, "test", sleep=waits.append)
    assert waits == [] and _left(lake) == 0


def test_keys_already_gone_are_no_error(lake: Lake) -> None:
    """A pass cut short leaves some candidates deleted; the next pass names them again."""
    keys = _put(lake, 3)
    obstore.delete(lake.object_store, keys[0])
    delete_paced(lake, keys, 0, "test")
    assert _left(lake) == 0


def test_maintenance_vacuums_the_compacted_files_at_the_configured_pace(
    minio_lake: Lake,
) -> None:
    """With tombstones kept and a 0 h vacuum, the pass deletes the five files compaction
    replaced, through the paced deletes, and the table still reads whole."""
    lake = Lake(minio_lake.settings.model_copy(update={"vacuum_deletes_per_s": 2.0}))
    table = "timezone_unified"
    ensure_table(lake, table, UNIFIED_SCHEMA)
    appender = TableAppender(lake, table, lake.open(table))
    for seq in range(5):
        rows = unified_rows(seq * 10, 10)
        assert appender.append_once(rows, app_id="w", seq=seq, custom_metadata={}, what="append")
    first = maintain_table(lake, table, retention_hours=None)  # a week: nothing yet
    assert first.files_compacted == 5 and first.files_vacuumed == 0
    second = maintain_table(lake, table, retention_hours=0, full_vacuum=False)
    assert second.files_vacuumed == 5
    listed = [m["path"] for c in obstore.list(lake.object_store, prefix=f"{table}/") for m in c]
    assert len([p for p in listed if "_delta_log" not in p]) == 1  # the compacted file alone
    messages = lake.open(table).to_pyarrow_table(columns=["message"]).column("message")
    assert sorted(messages.to_pylist()) == sorted(unified_rows(0, 50).column("message").to_pylist())
