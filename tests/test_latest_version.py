"""`Lake.latest_version`: a table's newest version from `_last_checkpoint` and one listing
of the log after it, on MinIO and on a local directory."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltabus.core.errors import StorageError
from deltabus.delta.lake import Lake

SCHEMA = pa.schema([("n", pa.int64())])


def _append(lake: Lake, table: str, n: int) -> None:
    write_deltalake(
        lake.uri(table),
        pa.table({"n": [n]}, schema=SCHEMA),
        mode="append",
        storage_options=lake.storage_options,
    )


def test_the_latest_version_follows_commits_and_checkpoints(lake: Lake) -> None:
    for n in range(3):
        _append(lake, "t", n)
    assert lake.latest_version("t") == 2

    lake.open("t").create_checkpoint()  # `_last_checkpoint` names version 2
    assert lake.latest_version("t") == 2

    for n in range(3, 15):  # commits after the checkpoint
        _append(lake, "t", n)
    assert lake.latest_version("t") == lake.open("t").version() == 14


def test_a_missing_table_has_no_latest_version(lake: Lake) -> None:
    with pytest.raises(StorageError, match="no Delta table"):
        lake.latest_version("absent")
