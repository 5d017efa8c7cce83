"""A short Delta log retention keeps commits cheap; state and restarts survive it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.bus.tail import DeltaLogTail
from deltabus.core.errors import StorageError
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli
from tests.helpers import assert_exactly_once


def log_files(lake: Lake, table: str) -> list[str]:
    return sorted(p.name for p in (Path(lake.uri(table)) / "_delta_log").glob("*.json"))


def test_expired_log_keeps_state_and_is_detected(tmp_path: Path) -> None:
    lake = Lake(
        Settings(storage="local", local_root=tmp_path / "lake", prefix="p", log_retention_s=10)
    )
    env = lake_env(lake) | {"DELTABUS_LOG_RETENTION_S": "10"}
    # About 120 commits per table in 6 s.
    first = ProducerConfig(rate=2000, count=12_000, commit_interval=0.05, run_id="old")
    assert TimezoneProducer(lake, first).run().messages == 12_000
    etl = run_cli(["etl"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-2000:]
    assert len(log_files(lake, "timezone1")) > 100

    time.sleep(11)  # everything so far is now older than the retention
    second = ProducerConfig(rate=2000, count=12_000, commit_interval=0.05, run_id="new")
    TimezoneProducer(lake, second).run()
    # Checkpoints (every 100 commits) deleted the expired log files.
    remaining = log_files(lake, "timezone1")
    assert remaining[0] != "00000000000000000000.json"
    assert len(remaining) < 200

    # The ETL resumes from positions kept as app transactions, not from expired metadata.
    etl = run_cli(["etl", "--producers", "2"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-2000:]
    assert_exactly_once(lake, expected=24_000)

    # A producer rerun resumes from its app transactions: nothing written twice.
    rerun = TimezoneProducer(lake, first).run()
    assert rerun.messages == 0
    assert_exactly_once(lake, expected=24_000)

    # A reader that lagged behind the retention stops loudly instead of skipping rows.
    tail = DeltaLogTail(lake, "timezone1")
    with pytest.raises(StorageError, match="expired from the Delta log"):
        tail.commit(1)


def test_a_version_that_landed_with_its_checkpoint_after_a_miss_is_not_expired(
    tmp_path: Path,
) -> None:
    """A tail finds version 2 missing; the writer then commits it and checkpoints at 2
    before the tail looks at the checkpoint. That is a version that landed, not one that
    expired: the tail reads it next."""
    from deltalake import DeltaTable

    lake = Lake(Settings(storage="local", local_root=tmp_path / "lake", prefix="p"))
    config = ProducerConfig(rate=1000, count=20, commit_interval=0.01, run_id="race")
    TimezoneProducer(lake, config).run()
    table = DeltaTable(lake.uri("timezone1"))
    assert table.version() >= 2
    table.create_checkpoint()
    tail = DeltaLogTail(lake, "timezone1")
    tail._check_not_expired(table.version())  # the tail's miss came before the commit
    assert tail.commit(table.version()) is not None
    (Path(lake.uri("timezone1")) / "_delta_log" / f"{table.version():020d}.json").unlink()
    tail._expiry_checked = 0.0
    with pytest.raises(StorageError, match="expired from the Delta log"):
        tail._check_not_expired(table.version())  # gone behind the checkpoint: expired


def test_lag_agrees_with_the_etl_after_log_cleanup(tmp_path: Path) -> None:
    """The service's lag reads positions as the ETL does, also once ETL commits expired."""
    from deltalake import DeltaTable

    from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA, UNIFIED_TABLE
    from deltabus.apps.timezones.etl.positions import recorded_positions
    from deltabus.apps.timezones.service import lag
    from deltabus.bus.fence import claim

    lake = Lake(
        Settings(storage="local", local_root=tmp_path / "lake", prefix="p", log_retention_s=10)
    )
    env = lake_env(lake) | {"DELTABUS_LOG_RETENTION_S": "10"}
    config = ProducerConfig(rate=2000, count=4000, commit_interval=0.05, run_id="lagdrift")
    TimezoneProducer(lake, config).run()
    etl = run_cli(["etl"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-2000:]
    before = lag(lake)
    assert before["data_commits_behind"] == 0

    time.sleep(11)  # every ETL commit is now older than the retention
    unified = DeltaTable(lake.uri(UNIFIED_TABLE))
    claim(unified, UNIFIED_TABLE, UNIFIED_SCHEMA, "continuous")  # a new ETL starts: no rows
    unified.create_checkpoint()
    unified.cleanup_metadata()
    # Only the claim's log file is left: no commit metadata records positions any more.
    assert log_files(lake, UNIFIED_TABLE) == [f"{unified.version():020d}.json"]
    positions, _ = recorded_positions(DeltaTable(lake.uri(UNIFIED_TABLE)))
    after = lag(lake)
    assert {t: v["processed_version"] for t, v in after["tables"].items()} == positions
    assert all(v >= 0 for v in positions.values())
    assert after["data_commits_behind"] == 0


def _checkpoint_removes(lake: Lake, table: str) -> int:
    """Remove actions in the newest checkpoint of `table`."""
    import json

    import pyarrow.parquet as pq

    log = Path(lake.uri(table)) / "_delta_log"
    last = json.loads((log / "_last_checkpoint").read_text())
    part = pq.read_table(log / f"{last['version']:020d}.checkpoint.parquet", columns=["remove"])
    return part.num_rows - part.column("remove").null_count


@pytest.mark.parametrize("deleted_file_retention_s", [None, 10])
def test_removed_files_leave_the_log_state_after_their_retention(
    tmp_path: Path, deleted_file_retention_s: int | None
) -> None:
    """After a compaction, the producer's next checkpoint (written from its memory) keeps
    the removed files for delta.deletedFileRetentionDuration: a week by default, so a
    stream compacted every few minutes grows its checkpoints and writers' memory for a
    week; 10 s here, so they are gone 11 s later."""
    from deltabus.delta.maintenance import maintain_table

    lake = Lake(
        Settings(
            storage="local",
            local_root=tmp_path / "lake",
            prefix="p",
            checkpoint_interval=5,
            deleted_file_retention_s=deleted_file_retention_s,
        )
    )
    first = ProducerConfig(rate=2000, count=6000, commit_interval=0.05, run_id="a")
    assert TimezoneProducer(lake, first).run().messages == 6000
    dt = lake.open("timezone1")
    expected = None if deleted_file_retention_s is None else "interval 10 seconds"
    assert dt.metadata().configuration.get("delta.deletedFileRetentionDuration") == expected
    compacted = maintain_table(lake, "timezone1", retention_hours=1)
    assert compacted.files_compacted >= 5
    assert _checkpoint_removes(lake, "timezone1") >= compacted.files_compacted

    time.sleep(11)
    second = ProducerConfig(rate=2000, count=6000, commit_interval=0.05, run_id="b")
    assert TimezoneProducer(lake, second).run().messages == 6000
    assert lake.open("timezone1").version() >= compacted.version_after + 5  # a new checkpoint
    removes = _checkpoint_removes(lake, "timezone1")
    if deleted_file_retention_s is None:
        assert removes >= compacted.files_compacted
    else:
        assert removes == 0
