"""The stream producer as a Kafka user expects it: ids fenced, sends that never wait for
storage, a bounded buffer, delivery callbacks, resume by record, Kafka's key hashing.

On the real MinIO (and a local directory where the store does not matter).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import deltabus
from deltabus.bus.partitioning import key_partition, murmur2
from deltabus.delta.lake import Lake
from tests.bus_worker import ID_BASE, ORDERS_SCHEMA, order
from tests.conftest import lake_env, run_cli

pytestmark = pytest.mark.timeout(300)


def stored_ids(lake: Lake, stream: deltabus.Stream) -> Counter:
    ids: Counter = Counter()
    for table in stream.tables:
        dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
        ids.update(dt.to_pyarrow_table(columns=["order_id"]).column(0).to_pylist())
    return ids


def test_a_second_producer_of_an_id_fences_the_first(minio_lake: Lake) -> None:
    """Two processes' worth of producers (each its own lake handle and appenders): the
    newer one's open makes the older one stop at its next commit, with FencedError, and
    its delivery callbacks get the error; the newer one resends what the older one had
    not committed, and every record is stored once."""
    stream = deltabus.Bus(minio_lake).create_stream(
        "orders", ORDERS_SCHEMA, partitions=3, key="customer"
    )
    older = deltabus.Bus(Lake(minio_lake.settings)).producer("orders", "shop", 0)
    older.send_batch(pa.Table.from_pylist([order(1, o) for o in range(50)]))
    assert older.flush() == 50
    outcomes: list[BaseException | None] = []
    older.send(order(1, 50), on_delivery=lambda _offset, error: outcomes.append(error))

    newer = deltabus.Bus(Lake(minio_lake.settings)).producer("orders", "shop", 0)
    assert newer.epoch == older.epoch + 1 and newer.committed == 50
    with pytest.raises(deltabus.FencedError, match="another producer with id shop"):
        older.flush()
    assert len(outcomes) == 1 and isinstance(outcomes[0], deltabus.FencedError)
    with pytest.raises(deltabus.FencedError):
        older.send(order(1, 51))  # a fenced producer refuses further sends

    newer.send_batch(pa.Table.from_pylist([order(1, o) for o in range(50, 80)]))
    assert newer.flush() == 80
    newer.close()
    assert stored_ids(minio_lake, stream) == Counter(1 * ID_BASE + o for o in range(80))


def test_send_does_not_wait_for_a_flush_in_progress(local_lake: Lake) -> None:
    """While a flush's commit is held up (as by a slow store), `send` returns at once and
    its record is committed by the next flush."""
    bus = deltabus.Bus(local_lake)
    stream = bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    producer = bus.producer("orders", "slow", commit_interval_ms=0)
    release, entered = threading.Event(), threading.Event()
    real_commit = producer._commit

    def held_commit(*args: object) -> None:
        entered.set()
        assert release.wait(30)
        real_commit(*args)  # type: ignore[arg-type]

    producer._commit = held_commit  # type: ignore[method-assign]
    producer.send(order(2, 0))
    flusher = threading.Thread(target=producer.flush)
    flusher.start()
    assert entered.wait(30)
    assert producer.send(order(2, 1)) == 1  # returns while the commit is still held
    assert flusher.is_alive() and not release.is_set()
    release.set()
    flusher.join()
    assert producer.committed == 1
    producer._commit = real_commit  # type: ignore[method-assign]
    assert producer.flush() == 2
    producer.close()
    assert sum(stored_ids(local_lake, stream).values()) == 2


def test_a_full_buffer_blocks_send_then_raises(local_lake: Lake) -> None:
    bus = deltabus.Bus(local_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=1)
    manual = bus.producer("orders", "manual", 0, max_buffered_records=10, max_block_s=0.3)
    manual.send_batch(pa.Table.from_pylist([order(3, o) for o in range(10)]))
    started = time.monotonic()
    with pytest.raises(deltabus.BufferFullError, match="max_buffered_records 10"):
        manual.send(order(3, 10))
    assert time.monotonic() - started >= 0.3
    assert manual.flush() == 10
    assert manual.send(order(3, 10)) == 10  # room again
    manual.close()
    # With a background flusher, a full buffer makes it flush early: sends only wait.
    delivered: list[int] = []
    with bus.producer("orders", "auto", 60_000, max_buffered_records=10) as auto:
        for o in range(100):
            auto.send(order(4, o), on_delivery=lambda offset, _e: delivered.append(offset))
        assert auto.committed >= 90  # flushed long before the 60 s interval
    assert sorted(delivered) == list(range(100))


def test_delivery_callbacks_tell_each_send_its_commit(local_lake: Lake) -> None:
    bus = deltabus.Bus(local_lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    seen: list[tuple[int, BaseException | None]] = []
    with bus.producer("orders", "cb", commit_interval_ms=0) as producer:
        producer.send(order(5, 0), on_delivery=lambda o, e: seen.append((o, e)))
        producer.send_batch(
            pa.Table.from_pylist([order(5, o) for o in range(1, 4)]),
            on_delivery=lambda o, e: seen.append((o, e)),
        )
        assert seen == []  # nothing committed yet
        producer.flush()
    assert seen == [(0, None), (1, None)]


def test_murmur2_matches_kafka() -> None:
    """Kafka's own test vectors for `Utils.murmur2`, and its partition formula."""
    vectors = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, expected in vectors.items():
        assert murmur2(data) == expected, data
    assert key_partition("foobar", 7, "murmur2") == (-790332482 & 0x7FFFFFFF) % 7


def test_a_murmur2_stream_places_keys_as_kafka_does(local_lake: Lake) -> None:
    bus = deltabus.Bus(local_lake)
    stream = bus.create_stream(
        "orders", ORDERS_SCHEMA, partitions=6, key="customer", partitioner="murmur2"
    )
    assert bus.stream("orders").partitioner == "murmur2"
    with pytest.raises(deltabus.ConfigError, match="hashes keys with murmur2"):
        bus.create_stream("orders", ORDERS_SCHEMA, partitions=6, key="customer")
    with bus.producer("orders", "kafka-like", 0) as producer:
        producer.send_batch(pa.Table.from_pylist([order(6, o) for o in range(60)]))
    for p, table in enumerate(stream.tables):
        dt = DeltaTable(local_lake.uri(table))
        for customer in dt.to_pyarrow_table(columns=["customer"]).column(0).to_pylist():
            expected = (murmur2(customer.encode()) & 0x7FFFFFFF) % 6
            assert expected == p, (customer, p)


def test_the_cli_resumes_by_record_not_by_line(lake: Lake, tmp_path: Path) -> None:
    """JSON lines with a blank line every ten: a run stopped part-way and run again on the
    whole file stores every record once (skipping counts records, not lines)."""
    env = lake_env(lake)
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
            "order_id:int64!,amount:float64,ts:timestamp[ms,UTC],customer:string",
        ],
        env,
        tmp_path,
    )
    assert created.returncode == 0, created.stderr
    lines = []
    for o in range(300):
        if o % 10 == 0:
            lines.append("")
        lines.append(json.dumps({"order_id": o, "customer": f"c{o % 7}"}))

    def produce(text: list[str]) -> subprocess.CompletedProcess[str]:
        return run_cli(
            ["produce", "--stream", "orders", "--producer-id", "file-2"],
            env,
            tmp_path,
            input="\n".join(text) + "\n",
        )

    first = produce(lines[:150])  # as if it had been stopped there
    assert first.returncode == 0, first.stderr
    done = json.loads(first.stderr.strip().splitlines()[-1])["committed"]
    assert 0 < done < 300
    again = produce(lines)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stderr.strip().splitlines()[-1])["skipped"] == done
    stream = deltabus.Bus(lake).stream("orders")
    assert stored_ids(lake, stream) == Counter(range(300))
