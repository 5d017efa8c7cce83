"""Group and stream administration from the command line, as Kafka's tools do it:
list, describe, delete, reset-offsets (refused while the group is in use), and a stream
delete that says what it removes and asks first.

Real `deltabus` processes on the real MinIO.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import deltabus
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, run_cli

pytestmark = pytest.mark.timeout(300)

SCHEMA = "order_id:int64!,customer:string"


def produce(env: dict[str, str], cwd: Path, ids: range) -> None:
    """Send `ids` as a run of a producer of its own (an id resumes its own input)."""
    producer = f"p{ids.start}"
    lines = "".join(json.dumps({"order_id": i, "customer": f"c{i % 3}"}) + "\n" for i in ids)
    done = run_cli(
        ["produce", "--stream", "orders", "--producer-id", producer], env, cwd, input=lines
    )
    assert done.returncode == 0, done.stderr


def consume(env: dict[str, str], cwd: Path, group: str = "billing") -> list[int]:
    done = run_cli(
        ["consume", "--stream", "orders", "--group", group, "--idle-exit-s", "2"], env, cwd
    )
    assert done.returncode == 0, done.stderr
    return sorted(json.loads(line)["order_id"] for line in done.stdout.splitlines())


def cli_json(args: list[str], env: dict[str, str], cwd: Path) -> dict:
    done = run_cli(["--json", *args], env, cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def orders(minio_lake: Lake, tmp_path: Path) -> dict[str, str]:
    env = lake_env(minio_lake)
    created = run_cli(
        [
            "streams",
            "create",
            "orders",
            "--partitions",
            "2",
            "--key",
            "customer",
            "--schema",
            SCHEMA,
        ],
        env,
        tmp_path,
    )
    assert created.returncode == 0, created.stderr
    return env


def test_reset_offsets_to_each_target(orders: dict[str, str], tmp_path: Path) -> None:
    env = orders
    produce(env, tmp_path, range(0, 60))
    assert consume(env, tmp_path) == list(range(60))
    listed = run_cli(["groups", "list"], env, tmp_path)
    assert listed.stdout.split() == ["billing"]

    planned = cli_json(
        ["groups", "reset-offsets", "billing", "--to-earliest", "--dry-run"], env, tmp_path
    )
    assert {p["after"] for p in planned["partitions"].values()} == {0}
    assert consume(env, tmp_path) == []  # a dry run writes nothing
    cli_json(["groups", "reset-offsets", "billing", "--to-earliest"], env, tmp_path)
    assert consume(env, tmp_path) == list(range(60))  # all again

    time.sleep(1.1)
    cut = datetime.now(UTC)
    time.sleep(1.1)
    produce(env, tmp_path, range(60, 90))
    moved = cli_json(
        ["groups", "reset-offsets", "billing", "--to-datetime", cut.isoformat()], env, tmp_path
    )
    assert all(p["after"] <= p["before"] for p in moved["partitions"].values())
    assert consume(env, tmp_path) == list(range(60, 90))  # only what came after

    cli_json(["groups", "reset-offsets", "billing", "--to-latest"], env, tmp_path)
    produce(env, tmp_path, range(90, 95))
    assert consume(env, tmp_path) == list(range(90, 95))

    one = cli_json(
        ["groups", "reset-offsets", "billing", "--to-version", "0", "--partition", "1"],
        env,
        tmp_path,
    )
    assert list(one["partitions"]) == ["orders-p1"]
    in_p1 = [i for i in range(95) if deltabus.key_partition(f"c{i % 3}", 2) == 1]
    assert in_p1 and consume(env, tmp_path) == in_p1  # partition 1's records, once


def test_a_group_in_use_is_neither_reset_nor_deleted(
    orders: dict[str, str], minio_lake: Lake, tmp_path: Path
) -> None:
    env = orders
    produce(env, tmp_path, range(10))
    member = deltabus.Bus(minio_lake).consumer("orders", "live")
    try:
        assert member.poll(10) is not None
        for args in (
            ["groups", "reset-offsets", "live", "--to-earliest"],
            ["groups", "delete", "live"],
        ):
            refused = run_cli(args, env, tmp_path)
            assert refused.returncode == 2, refused.stderr
            assert "live member" in refused.stderr and "stop its consumers" in refused.stderr
    finally:
        member.close()  # leaves the group at once
    deleted = cli_json(["groups", "delete", "live"], env, tmp_path)
    assert deleted["objects"] > 0
    assert "live" not in run_cli(["groups", "list"], env, tmp_path).stdout.split()
    missing = run_cli(["groups", "delete", "live"], env, tmp_path)
    assert missing.returncode == 2 and "no consumer group 'live'" in missing.stderr


def test_deleting_a_stream_says_what_it_removes_and_asks(
    orders: dict[str, str], minio_lake: Lake, tmp_path: Path
) -> None:
    env = orders
    produce(env, tmp_path, range(20))
    consume(env, tmp_path)
    unconfirmed = run_cli(["streams", "delete", "orders"], env, tmp_path)
    assert unconfirmed.returncode == 2
    assert "orders-p0, orders-p1" in unconfirmed.stderr and "--yes" in unconfirmed.stderr
    assert run_cli(["streams", "list"], env, tmp_path).stdout.split() == ["orders"]
    deleted = cli_json(["streams", "delete", "orders", "--yes"], env, tmp_path)
    assert deleted["objects"] > 0 and deleted["bytes"] > 0
    assert run_cli(["streams", "list"], env, tmp_path).stdout.split() == []
    assert not minio_lake.has_objects("orders-p0") and not minio_lake.has_objects("orders-p1")
    gone = run_cli(["streams", "describe", "orders"], env, tmp_path)
    assert gone.returncode == 2 and "no stream 'orders'" in gone.stderr
