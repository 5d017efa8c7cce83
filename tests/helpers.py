"""Reading tables back for assertions: real Delta reads, no mocks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA, UNIFIED_TABLE
from deltabus.apps.timezones.layout import read_layout
from deltabus.core.processes import LAKE_ENV_PREFIXES
from deltabus.delta.lake import Lake

DATE_FORMAT = "%Y-%m-%d %H:%M:%S.%f %z"


def read_table(lake: Lake, table: str) -> pl.DataFrame:
    dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
    return pl.from_arrow(dt.to_pyarrow_table())  # type: ignore[return-value]


def read_inputs(lake: Lake) -> pl.DataFrame:
    """Both streams, every partition (the lake's recorded layout), with their table."""
    tables = read_layout(lake).input_tables
    return pl.concat(
        [read_table(lake, t).with_columns(source=pl.lit(t)) for t in tables if lake.exists(t)]
    )


def read_unified(lake: Lake) -> pl.DataFrame:
    """The unified output: its table, or all of its partitions."""
    tables = [t for t in read_layout(lake).unified_tables if lake.exists(t)]
    if not tables:
        return read_table(lake, UNIFIED_TABLE)  # raises the usual "no table" error
    return pl.concat([read_table(lake, t) for t in tables])


def epoch_ms(date: str) -> float:
    """The true epoch milliseconds of a `date` value, by the standard library."""
    return datetime.strptime(date, DATE_FORMAT).timestamp() * 1000


def assert_exactly_once(lake: Lake, expected: int | None = None) -> pl.DataFrame:
    """Every input message is in the unified table exactly once with diff = 1."""
    inputs = read_inputs(lake)
    unified = read_unified(lake)
    if expected is not None:
        assert inputs.height == expected, f"inputs hold {inputs.height}, expected {expected}"
    dupes = unified.group_by("message").len().filter(pl.col("len") > 1)
    assert dupes.height == 0, f"duplicated messages: {dupes.head(5).to_dicts()}"
    missing = set(inputs["message"]) - set(unified["message"])
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    extra = set(unified["message"]) - set(inputs["message"])
    assert not extra, f"{len(extra)} unexpected messages, e.g. {sorted(extra)[:5]}"
    assert unified["diff"].to_list() == [1] * unified.height
    return unified


def etl_process(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "deltabus", "etl", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_file(path: Path, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"process exited early: {process.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout}s"
        time.sleep(0.05)


def unified_rows(start: int, n: int) -> pa.Table:
    """Rows m{start} .. m{start + n - 1} in the unified table's schema, for writer tests."""
    return pa.Table.from_pydict(
        {
            "timestamp": [float(i) + 0.5 for i in range(start, start + n)],
            "message": [f"m{i}" for i in range(start, start + n)],
            "time": list(range(start, start + n)),
            "diff": [1] * n,
        },
        schema=UNIFIED_SCHEMA,
    )


class DevMinioCli(NamedTuple):
    """What a `deltabus minio up` / `down` test runs with."""

    env_file: Path  # names the endpoint and the bucket; `up` writes credentials into it
    env: dict[str, str]  # this process's environment without lake settings
    data_dir: Path
    up: list[str]
    down: list[str]


def dev_minio_cli(tmp_path: Path, port: int, bucket: str) -> DevMinioCli:
    """A dev MinIO on `port` with `bucket`, driven by the CLI as a user would."""
    env_file = tmp_path / "dev.env"
    env_file.write_text(
        f"DELTABUS_MINIO_ENDPOINT=http://127.0.0.1:{port}\nDELTABUS_BUCKET={bucket}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAKE_ENV_PREFIXES)}
    data_dir = tmp_path / "minio"
    up = ["--env-file", str(env_file), "minio", "up", "--data-dir", str(data_dir)]
    return DevMinioCli(env_file, env, data_dir, up, ["minio", "down", "--data-dir", str(data_dir)])


def batch_row(source: str, version: int, messages: list[str], diff: int = 1) -> dict:
    """A row as the Delta sink receives it from the transform: one input version's rows
    (`timestamp`, `message`, `diff`) in a wrapped Arrow table, with its source and version."""
    import pathway as pw

    rows = pa.table(
        {
            "timestamp": [float(i) + 0.5 for i in range(len(messages))],
            "message": messages,
            "diff": pa.array([diff] * len(messages), pa.int64()),
        }
    )
    return {"rows": pw.wrap_py_object(rows), "source": source, "version": version}
