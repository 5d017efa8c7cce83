"""An input commit whose data file is not Parquet, on a real MinIO lake with a real ETL.

By default the ETL stops within seconds with exit 2 and one message naming the table,
the version and the file; nothing of that version is written and the positions stay.
With `--on-corrupt-file skip` the file is left out (logged, counted in the report) and
the rest goes through.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from deltabus.apps.timezones.contracts import INPUT_SCHEMA, UNIFIED_TABLE
from deltabus.apps.timezones.etl.positions import position_marker
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli
from tests.helpers import read_table


def contract_rows(prefix: str, n: int) -> pa.Table:
    base = datetime(2026, 3, 8, 1, 59, 0)
    return pa.table(
        {
            "date": [
                (base + timedelta(milliseconds=37 * i)).strftime("%Y-%m-%d %H:%M:%S.%f -0500")
                for i in range(n)
            ],
            "message": [f"{prefix}-{i}" for i in range(n)],
        },
        schema=INPUT_SCHEMA,
    )


def append(lake: Lake, table: str, data: pa.Table) -> tuple[int, str]:
    """Append `data` as another writer would: (the version, the data file it added)."""
    write_deltalake(lake.uri(table), data, mode="append", storage_options=lake.storage_options)
    version = DeltaTable(lake.uri(table), storage_options=lake.storage_options).version()
    actions = [json.loads(line) for line in log_entry(lake, table, version).splitlines()]
    (added,) = [a["add"]["path"] for a in actions if "add" in a]
    return version, added


def log_entry(lake: Lake, table: str, version: int) -> str:
    s = lake.settings
    body = lake.s3_client().get_object(
        Bucket=s.bucket, Key=f"{s.prefix}/{table}/_delta_log/{version:020d}.json"
    )["Body"]
    return body.read().decode()


def damage(lake: Lake, table: str, path: str, *, keep_magic: bool) -> None:
    """Replace a data file's bytes with bytes that are not Parquet: with `keep_magic`, as
    many bytes as before between Parquet's magic numbers (pyarrow: "Couldn't deserialize
    thrift"), else plain text ("Parquet magic bytes not found")."""
    s = lake.settings
    client = lake.s3_client()
    key = f"{s.prefix}/{table}/{path}"
    size = client.head_object(Bucket=s.bucket, Key=key)["ContentLength"]
    body = b"PAR1" + bytes(size - 8) + b"PAR1" if keep_magic else b"not Parquet\n" * 40
    client.put_object(Bucket=s.bucket, Key=key, Body=body)


def recorded_position(lake: Lake, table: str) -> int:
    dt = DeltaTable(lake.uri(UNIFIED_TABLE), storage_options=lake.storage_options)
    found = dt.transaction_version(position_marker(table))
    return -1 if found is None else found


def test_corrupt_input_file_stops_the_etl_then_skip_lets_the_rest_through(
    minio_lake: Lake, tmp_path: Path
) -> None:
    env = lake_env(minio_lake) | {"DELTABUS_RETRY_MAX_WAIT_S": "60"}
    config = ProducerConfig(rate=20_000, count=600, commit_interval=0.05, run_id="cf")
    assert TimezoneProducer(minio_lake, config).run().messages == 600
    first = run_cli(["etl"], env, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    unified_before = read_table(minio_lake, UNIFIED_TABLE)
    assert unified_before.height == 600
    position_before = recorded_position(minio_lake, "timezone1")

    bad_version, bad_file = append(minio_lake, "timezone1", contract_rows("bad", 20))
    damage(minio_lake, "timezone1", bad_file, keep_magic=True)
    text_version, text_file = append(minio_lake, "timezone1", contract_rows("text", 10))
    damage(minio_lake, "timezone1", text_file, keep_magic=False)
    later_version, _ = append(minio_lake, "timezone1", contract_rows("later", 30))
    assert later_version == text_version + 1 == bad_version + 2
    assert position_before < bad_version

    started = time.monotonic()
    stopped = run_cli(["etl"], env, tmp_path)
    took = time.monotonic() - started
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert took < 30, f"the ETL took {took:.0f}s to stop (retry budget 60 s)"
    assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    message = [line for line in stopped.stderr.splitlines() if bad_file in line]
    assert len(message) == 1, stopped.stderr[-3000:]
    assert f"timezone1 version {bad_version}: data file {bad_file} cannot be read" in message[0]
    assert "Couldn't deserialize thrift" in message[0]
    assert "--on-corrupt-file skip" in stopped.stderr
    assert env["DELTABUS_SECRET_KEY"] not in stopped.stdout + stopped.stderr
    # Nothing of that version (or after it) is written; the positions stay.
    assert read_table(minio_lake, UNIFIED_TABLE).height == 600
    assert recorded_position(minio_lake, "timezone1") == position_before

    # A restart stops at the same place: nothing is skipped without being asked.
    again = run_cli(["etl"], env, tmp_path)
    assert again.returncode == 2 and f"version {bad_version}" in again.stderr

    # The setting (what a Dagster-launched ETL reads) asks for it as the option does.
    skip_env = {**env, "DELTABUS_ON_CORRUPT_FILE": "skip"}
    skipped = run_cli(["--json", "etl"], skip_env, tmp_path)
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    report = json.loads(skipped.stdout.strip().splitlines()[-1])
    assert report["skipped_files"] == 2, report
    assert f"timezone1 version {bad_version}: data file {bad_file} skipped" in skipped.stderr
    assert f"timezone1 version {text_version}: data file {text_file} skipped" in skipped.stderr
    unified = read_table(minio_lake, UNIFIED_TABLE)
    messages = set(unified["message"].to_list())
    assert {f"later-{i}" for i in range(30)} <= messages
    assert not any(m.startswith(("bad-", "text-")) for m in messages)
    assert unified.height == 630
    assert recorded_position(minio_lake, "timezone1") == later_version

    # Past it now: the next run has nothing to skip.
    rerun = run_cli(["--json", "etl", "--on-corrupt-file", "skip"], env, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["skipped_files"] == 0


def test_invalid_on_corrupt_file_option(local_lake: Lake, tmp_path: Path) -> None:
    result = run_cli(["etl", "--on-corrupt-file", "ignore"], lake_env(local_lake), tmp_path)
    assert result.returncode == 2
    assert "--on-corrupt-file" in result.stderr and "Traceback" not in result.stderr
