"""A user's own stream on deltabus, through the public API only: `orders` (4 partitions,
keyed by customer) on real MinIO, with producers and a consumer-group member SIGKILLed
mid-stream, a second group reading from the beginning, and another Delta writer's
delete arriving as retractions. Declarations run against a local directory too."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import deltabus
from deltabus.delta.lake import Lake
from tests.bus_worker import ID_BASE, ORDERS_SCHEMA, order
from tests.conftest import lake_env, run_cli

REPO = Path(__file__).resolve().parent.parent


def bus_of(lake: Lake) -> deltabus.Bus:
    return deltabus.Bus(lake)


def test_declaring_a_stream_is_idempotent_and_refuses_other_declarations(lake: Lake) -> None:
    bus = bus_of(lake)
    orders = bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    assert orders.tables == [f"orders-p{i}" for i in range(4)]
    assert all(lake.exists(t) for t in orders.tables)
    again = bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    assert again == orders and again.revision == 0
    assert bus.streams() == ["orders"]

    refused = {
        "partitions": dict(schema=ORDERS_SCHEMA, partitions=2, key="customer"),
        "key": dict(schema=ORDERS_SCHEMA, partitions=4, key=None),
        "type": dict(
            schema=ORDERS_SCHEMA.set(1, pa.field("amount", pa.string())),
            partitions=4,
            key="customer",
        ),
        "required column": dict(
            schema=ORDERS_SCHEMA.append(pa.field("region", pa.string(), nullable=False)),
            partitions=4,
            key="customer",
        ),
        "dropped column": dict(schema=ORDERS_SCHEMA.remove(1), partitions=4, key="customer"),
    }
    for case, declaration in refused.items():
        with pytest.raises(deltabus.ConfigError) as raised:
            bus.create_stream("orders", **declaration)  # type: ignore[arg-type]
        assert "fix:" in str(raised.value), case
    assert bus.stream("orders") == orders  # nothing was recorded by a refusal

    evolved = bus.create_stream(
        "orders",
        ORDERS_SCHEMA.append(pa.field("region", pa.string())),
        partitions=4,
        key="customer",
    )
    assert evolved.revision == 1 and evolved.schema.names[-1] == "region"
    for table in evolved.tables:
        assert (
            "region"
            in DeltaTable(lake.uri(table), storage_options=lake.storage_options)
            .schema()
            .to_arrow()
            .names
        )
    assert bus.stream("orders").schema.names[-1] == "region"

    with pytest.raises(deltabus.ConfigError) as unknown:
        bus.stream("clicks")
    assert "orders" in str(unknown.value)  # names the streams there are
    with pytest.raises(deltabus.ConfigError):
        bus.create_stream("Bad-Name", ORDERS_SCHEMA)


def test_a_record_that_does_not_fit_is_refused_and_nothing_is_written(lake: Lake) -> None:
    bus = bus_of(lake)
    bus.create_stream("orders", ORDERS_SCHEMA, partitions=2, key="customer")
    with bus.producer("orders", "strict", commit_interval_ms=0) as producer:
        good = {"order_id": 1, "amount": 2.5, "ts": 1_700_000_000_000, "customer": "ann"}
        for bad in (
            {**good, "coupon": "X"},  # an unknown column
            {**good, "order_id": "one"},  # a wrong type
            {**good, "customer": None},  # no key
        ):
            with pytest.raises(deltabus.RecordError):
                producer.send(bad)
        with pytest.raises(deltabus.RecordError):
            producer.send_batch(pa.Table.from_pylist([good, good]), keys=["only one"])
        assert producer.flush() == 0 and producer.commits == 0
        producer.send(good)
    assert producer.committed == 1
    rows = sum(
        DeltaTable(lake.uri(t), storage_options=lake.storage_options).to_pyarrow_table().num_rows
        for t in bus.stream("orders").tables
    )
    assert rows == 1


# -- processes ---------------------------------------------------------------------------


class Worker:
    """A `tests.bus_worker` process whose JSON lines are collected as they come."""

    def __init__(self, lake: Lake, *args: str, module: str = "tests.bus_worker") -> None:
        env = lake_env(lake) | {"PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def wait_for(self, predicate, timeout: float = 60.0) -> dict:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if predicate(line):
                    return line
            if self.process.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"worker exited: {self.process.stderr.read()[-3000:]}")  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"no such line in {self.lines[-3:]}"
            time.sleep(0.05)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            err = self.process.stderr.read()[-3000:]  # type: ignore[union-attr]
            raise AssertionError(f"worker exited with {self.process.returncode}: {err}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def batches_of(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def group_content(files: list[Path]) -> Counter:
    """Order ids (net of retractions) over the distinct batches the members wrote: a batch
    redelivered after a member died before committing it counts once."""
    seen: dict[tuple[int, int], dict] = {}
    for path in files:
        for batch in batches_of(path):
            seen.setdefault((batch["partition"], batch["version"]), batch)
    net: Counter = Counter()
    for batch in seen.values():
        for order_id, diff in zip(batch["ids"], batch["diff"], strict=True):
            net[order_id] += diff
    return +net


LATE = 260  # orders written after a member's kill: 20 per customer


def test_orders_exactly_once_across_sigkills_in_two_groups(
    minio_lake: Lake, tmp_path: Path
) -> None:
    lake = minio_lake
    bus = bus_of(lake)
    orders = bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    count = 3000
    expected = {p * ID_BASE + o for p in (1, 2) for o in range(count)}
    expected |= {3 * ID_BASE + o for o in range(LATE)}

    files = [tmp_path / "a1.jsonl", tmp_path / "a2.jsonl"]
    members = [Worker(lake, "consume", "group-a", str(f)) for f in files]
    producers = {p: Worker(lake, "produce", str(p), str(count)) for p in (1, 2)}
    try:
        for member in members:
            member.wait_for(lambda line: "member" in line)
        # Producer 1 dies mid-stream and comes back under the same id.
        producers[1].wait_for(lambda line: line.get("committed", 0) >= 600)
        producers[1].kill()
        producers[1] = Worker(lake, "produce", "1", str(count))
        resumed = producers[1].wait_for(lambda line: "resumed_at" in line)["resumed_at"]
        assert 600 <= resumed < count
        # Member 2 of group A dies once it has read something.
        deadline = time.monotonic() + 60
        while not batches_of(files[1]):
            assert time.monotonic() < deadline, "member 2 read nothing"
            time.sleep(0.1)
        held_by_dead = {b["partition"] for b in batches_of(files[1])}
        members[1].kill()
        killed_at = time.time()
        for producer in producers.values():
            producer.wait_for(lambda line: "done" in line, timeout=120)
        # Orders after the kill, on every customer, so the dead member's partitions have
        # something left to read however far it got before it died.
        with bus.producer("orders", "producer-3", commit_interval_ms=0) as late:
            late.send_batch(pa.Table.from_pylist([order(3, o) for o in range(LATE)]))

        # Every order is in the stream once.
        stored = Counter()
        for table in orders.tables:
            dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
            stored.update(dt.to_pyarrow_table(columns=["order_id"]).column(0).to_pylist())
        assert set(stored) == expected and max(stored.values()) == 1

        # Group A: the survivor takes the dead member's partitions and reads them on.
        deadline = time.monotonic() + 90
        while set(group_content(files)) != expected:
            assert time.monotonic() < deadline, len(expected - set(group_content(files)))
            time.sleep(0.2)
        assert max(group_content(files).values()) == 1
        survivor = {b["partition"] for b in batches_of(files[0])}
        assert held_by_dead <= survivor
        assert time.time() - killed_at < 60

        # Group B reads everything from the beginning, independently of group A.
        with bus.consumer("orders", group="group-b", ttl_s=3.0) as reader:
            got: Counter = Counter()
            deadline = time.monotonic() + 60
            while set(got) != expected:
                assert time.monotonic() < deadline, len(expected - set(got))
                batch = reader.poll(0.5)
                if batch is not None:
                    assert set(batch.rows.column("diff").to_pylist()) == {1}
                    got.update(batch.rows.column("order_id").to_pylist())
            assert max(got.values()) == 1
            assert sorted(reader.assigned()) == orders.tables  # the only member holds all
            reader.commit()
            assert set(reader.lag().values()) == {0}

            # Another Delta writer deletes rows of partition 0: they arrive as retractions.
            part0 = DeltaTable(lake.uri(orders.tables[0]), storage_options=lake.storage_options)
            doomed = set(part0.to_pyarrow_table(columns=["order_id"]).column(0).to_pylist()[:25])
            ids = ", ".join(str(i) for i in sorted(doomed))
            part0.delete(f"order_id IN ({ids})")
            retracted: set[int] = set()
            deadline = time.monotonic() + 30
            while retracted != doomed:
                assert time.monotonic() < deadline, doomed - retracted
                batch = reader.poll(0.5)
                if batch is not None:
                    assert batch.partition == 0
                    for order_id, diff in zip(
                        batch.rows.column("order_id").to_pylist(),
                        batch.rows.column("diff").to_pylist(),
                        strict=True,
                    ):
                        assert diff == -1 and order_id in doomed
                        retracted.add(order_id)
        described = bus.describe_group("group-b")
        assert all(p["member"] is None for p in described["partitions"].values())
        assert described["partitions"][orders.tables[0]]["lag"] == 0
    finally:
        for worker in [*members, *producers.values()]:
            worker.stop()


def test_a_flush_cut_short_between_partitions_is_resent_once(lake: Lake) -> None:
    """What a SIGKILL between a flush's partition commits leaves: some partitions hold the
    flush, others not. A producer opened again under the same id resumes where that flush
    started, and of the records sent again each partition keeps only those it lacks."""
    bus = bus_of(lake)
    orders = bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    first = bus.producer("orders", "cut", commit_interval_ms=0)
    first.send_batch(pa.Table.from_pylist([order(7, o) for o in range(100)]))
    assert first.flush() == 100
    first.send_batch(pa.Table.from_pylist([order(7, o) for o in range(100, 300)]))
    # The flush of offsets 100-300, cut short: only the partitions below 2 commit it.
    rows = pa.concat_tables(first._pending)
    parts = pa.array(np.concatenate(first._pending_keys))
    written = sorted(set(parts.to_pylist()))
    assert len(written) == 4
    for p in written[:2]:
        mask = pc.equal(parts, p)
        first._commit(p, rows.filter(mask).cast(first.types), 100, 300, len(written), {}, {})
    first._pending, first._pending_keys = [], []  # the process died here
    first.close()

    second = bus.producer("orders", "cut", commit_interval_ms=0)
    assert second.committed == 100  # the cut flush does not count
    second.send_batch(pa.Table.from_pylist([order(7, o) for o in range(100, 400)]))
    assert second.flush() == 400
    second.close()
    assert bus.producer("orders", "cut", commit_interval_ms=0).committed == 400
    stored: Counter = Counter()
    for table in orders.tables:
        dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
        stored.update(dt.to_pyarrow_table(columns=["order_id"]).column(0).to_pylist())
    assert set(stored) == {7 * ID_BASE + o for o in range(400)}
    assert max(stored.values()) == 1


def test_streams_from_the_command_line(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    schema = "order_id:int64!,amount:float64,ts:timestamp[ms,UTC],customer:string"
    created = run_cli(
        [
            "streams",
            "create",
            "orders",
            "--schema",
            schema,
            "--partitions",
            "4",
            "--key",
            "customer",
        ],
        env,
        tmp_path,
    )
    assert created.returncode == 0, created.stderr
    listed = run_cli(["streams", "list"], env, tmp_path)
    assert listed.stdout.split() == ["orders"]

    lines = [
        json.dumps(
            {"order_id": i, "amount": i / 4, "ts": "2026-11-26T12:00:00Z", "customer": f"c{i}"}
        )
        for i in range(1, 7)
    ]
    broken = [*lines[:3], '{"order_id": "four"}', *lines[3:]]

    def produce(text: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "deltabus",
                "produce",
                "--stream",
                "orders",
                "--producer-id",
                "file-1",
            ],
            input="\n".join(text) + "\n",
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = produce(broken)
    assert first.returncode == 2, first.stderr
    assert "line 4" in first.stderr and "the 3 records before it are committed" in first.stderr
    assert "Traceback" not in first.stderr
    fixed = produce([*lines[:3], json.dumps({"order_id": 40, "customer": "c40"}), *lines[3:]])
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stderr.strip().splitlines()[-1])["skipped"] == 3

    consumed = run_cli(
        ["consume", "--stream", "orders", "--group", "cli", "--idle-exit-s", "2"], env, tmp_path
    )
    assert consumed.returncode == 0, consumed.stderr
    rows = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(r["order_id"] for r in rows) == [1, 2, 3, 4, 5, 6, 40]
    by_id = {r["order_id"]: r for r in rows}
    assert {r["diff"] for r in rows} == {1} and by_id[40]["ts"] is None
    assert by_id[1]["ts"] == "2026-11-26T12:00:00+00:00" and by_id[1]["_stream"] == "orders"
    described = run_cli(["--json", "groups", "describe", "cli"], env, tmp_path)
    assert described.returncode == 0, described.stderr
    partitions = json.loads(described.stdout)["partitions"]
    assert set(partitions) == {f"orders-p{i}" for i in range(4)}
    assert all(p["lag"] == 0 for p in partitions.values()), partitions
    unknown = run_cli(["consume", "--stream", "clicks", "--group", "cli"], env, tmp_path)
    assert unknown.returncode == 2 and "no stream 'clicks'" in unknown.stderr


def test_stream_settings_are_recorded_and_set_on_the_tables(lake: Lake) -> None:
    import obstore

    bus = bus_of(lake)
    clicks = pa.schema([("page", pa.string()), ("at", pa.int64())])
    settings = deltabus.StreamSettings(log_retention_s=600, checkpoint_interval=3, compaction=False)
    bus.create_stream("clicks", clicks, settings=settings)
    assert bus.stream("clicks").settings == settings

    def retention() -> str:
        dt = DeltaTable(lake.uri("clicks"), storage_options=lake.storage_options)
        return dt.metadata().configuration["delta.logRetentionDuration"]

    assert retention() == "interval 600 seconds"
    with bus.producer("clicks", "web", commit_interval_ms=0) as producer:
        for i in range(4):  # versions 1-4: one of them is due for a checkpoint
            producer.send({"page": f"/p{i}", "at": i})
            producer.flush()
    logged = [
        str(m["path"]) for c in obstore.list(lake.object_store, "clicks/_delta_log/") for m in c
    ]
    assert any(path.endswith(".checkpoint.parquet") for path in logged), logged

    assert bus.create_stream("clicks", clicks).revision == 0  # no settings: kept as recorded
    changed = bus.create_stream(
        "clicks", clicks, settings=deltabus.StreamSettings(log_retention_s=1200)
    )
    assert changed.revision == 1 and bus.stream("clicks").settings.log_retention_s == 1200
    assert retention() == "interval 1200 seconds"
    with pytest.raises(deltabus.ConfigError):
        deltabus.StreamSettings(checkpoint_interval=0)


@pytest.mark.parametrize("engine", ["transform", "pathway"])
def test_a_link_sigkilled_and_restarted_writes_each_order_once(
    minio_lake: Lake, engine: str
) -> None:
    """orders -> orders_eur by the bus' transform or by a Pathway program through the
    connector, killed mid-stream and started again: every order lands once."""
    lake = minio_lake
    bus = bus_of(lake)
    killed = threading.Event()
    eur, done = feed_orders(bus, hold=killed)

    def start() -> Worker:
        if engine == "pathway":
            return Worker(lake, module="tests.bus_pathway_worker")
        return Worker(lake, "transform")

    worker = start()
    try:
        deadline = time.monotonic() + 90
        while sum(eur_ids(lake, eur).values()) < 300:
            assert time.monotonic() < deadline, worker.lines
            worker.check_alive()
            time.sleep(0.1)
        worker.kill()  # between output commits, or in the middle of one
        assert not done.is_set(), "the producer finished before the link was killed"
        killed.set()
        worker = start()
        assert done.wait(120)
        expected = {3 * ID_BASE + o for o in range(2000)}
        deadline = time.monotonic() + 90
        while set(out := eur_ids(lake, eur)) != expected and time.monotonic() < deadline:
            time.sleep(0.3)
        assert set(out) == expected and max(out.values()) == 1
        sample = DeltaTable(lake.uri(eur.tables[0]), storage_options=lake.storage_options)
        for row in sample.to_pyarrow_table().to_pylist():
            amount = (row["order_id"] - 3 * ID_BASE) * 0.25 * 0.9
            assert row["amount_eur"] == pytest.approx(amount)
    finally:
        worker.stop()


def feed_orders(
    bus: deltabus.Bus, hold: threading.Event | None = None
) -> tuple[deltabus.Stream, threading.Event]:
    """Declare orders and orders_eur (4 partitions), and produce 2,000 orders of producer 3
    over about 8 s in the background; the event is set when all are committed. With
    `hold`, the last 1,000 wait until it is set (so a test acts while orders still come,
    however slowly its worker starts)."""
    from tests.bus_worker import EUR_SCHEMA, order

    bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    eur = bus.create_stream("orders_eur", EUR_SCHEMA, partitions=4, key="customer")
    done = threading.Event()

    def produce() -> None:
        with bus.producer("orders", "shop", commit_interval_ms=0) as producer:
            for start in range(0, 2000, 50):
                if start == 1000 and hold is not None:
                    assert hold.wait(180), "the test never let the producer go on"
                rows = [order(3, o) for o in range(start, start + 50)]
                producer.send_batch(pa.Table.from_pylist(rows))
                producer.flush()
                time.sleep(0.2)
        done.set()

    threading.Thread(target=produce, daemon=True).start()
    return eur, done


def eur_ids(lake: Lake, eur: deltabus.Stream) -> Counter:
    """How often each order id is in orders_eur."""
    out: Counter = Counter()
    for table in eur.tables:
        dt = DeltaTable(lake.uri(table), storage_options=lake.storage_options)
        out.update(dt.to_pyarrow_table(columns=["order_id"]).column(0).to_pylist())
    return out


def test_a_second_program_of_a_pathway_link_fences_the_first(minio_lake: Lake) -> None:
    """Two programs of one link: the newer claims the target's tables, the older stops at
    its next commit with a clear error, and every order still lands once."""
    lake = minio_lake
    eur, done = feed_orders(bus_of(lake))
    first = Worker(lake, module="tests.bus_pathway_worker")
    second = None
    try:
        deadline = time.monotonic() + 90
        while sum(eur_ids(lake, eur).values()) < 300:
            assert time.monotonic() < deadline, first.lines
            first.check_alive()
            time.sleep(0.1)
        second = Worker(lake, module="tests.bus_pathway_worker")
        second.wait_for(lambda line: line.get("running"))
        fenced = first.wait_for(lambda line: "error" in line, timeout=60)
        assert first.process.wait(30) == 2
        assert fenced["error"] == "FencedError"
        assert "another Pathway link eur-pw took over orders_eur" in fenced["problem"]
        holder = bus_of(lake).output_holder(eur.tables[0])
        assert holder is not None and holder["owner"]["pid"] == second.process.pid
        assert holder["described"].startswith("continuous Pathway link eur-pw, pid")
        assert bus_of(lake).output_holder("no_such_table") is None
        assert done.wait(120)
        expected = {3 * ID_BASE + o for o in range(2000)}
        deadline = time.monotonic() + 90
        while set(out := eur_ids(lake, eur)) != expected and time.monotonic() < deadline:
            second.check_alive()
            time.sleep(0.3)
        assert set(out) == expected and max(out.values()) == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_table_of_the_name_with_other_columns_is_not_declared_over(lake: Lake) -> None:
    from deltabus.delta.tables import ensure_table

    ensure_table(lake, "clicks", pa.schema([("url", pa.string())]))
    bus = bus_of(lake)
    with pytest.raises(deltabus.ConfigError) as refused:
        bus.create_stream("clicks", ORDERS_SCHEMA)
    assert "table clicks exists" in refused.value.problem and "url string" in refused.value.problem
    assert bus.streams() == []
    assert lake.open("clicks").schema().to_arrow().names == ["url"]


def test_the_time_zone_inputs_are_streams_a_consumer_group_reads(minio_lake: Lake) -> None:
    """The time-zone producer declares its inputs: any consumer group reads them."""
    from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer

    config = ProducerConfig(rate=20_000, count=3_000, partitions=2, run_id="grp")
    report = TimezoneProducer(minio_lake, config).run()
    assert report.messages == 3_000
    bus = bus_of(minio_lake)
    assert bus.streams() == ["timezone1", "timezone2"]
    assert bus.stream("timezone2").tables == ["timezone2-p0", "timezone2-p1"]
    got: Counter = Counter()
    with bus.consumer(["timezone1", "timezone2"], group="audit") as reader:
        deadline = time.monotonic() + 60
        while len(got) < 3_000:
            assert time.monotonic() < deadline, len(got)
            batch = reader.poll(0.5)
            if batch is not None:
                got.update(batch.rows.column("message").to_pylist())
    assert set(got) == {f"grp-{i}" for i in range(3_000)} and max(got.values()) == 1
    # A second run of the producer declares nothing new.
    TimezoneProducer(minio_lake, ProducerConfig(rate=20_000, count=10, partitions=2)).run()
    assert bus.stream("timezone1").revision == 0


def test_a_producer_with_its_own_partitions_metadata_and_marks(lake: Lake) -> None:
    """What the time-zone producer builds on: rows with the writer's own partitions,
    commit metadata, marks read back after a restart, and a flush to every partition."""
    bus = bus_of(lake)
    orders = bus.create_stream("orders", ORDERS_SCHEMA, partitions=4, key="customer")
    rows = pa.Table.from_pylist([order(5, o) for o in range(10)])
    with bus.producer("orders", "own", commit_interval_ms=0) as producer:
        for bad in (np.full(10, 4), np.zeros(3, dtype=np.int64)):
            with pytest.raises(deltabus.RecordError):
                producer.send_batch(rows, partitions=bad)
        producer.send_batch(rows, partitions=np.full(10, 1))
        with pytest.raises(deltabus.ConfigError):
            producer.flush({"producer.end": 1})
        assert producer.flush({"batch.note": "rows"}, {"origin": 41}) == 10
        assert producer.flush({"batch.note": "end"}, {"origin": 42}, everywhere=True) == 10
    held = [lake.open(t).to_pyarrow_table().num_rows for t in orders.tables]
    assert held == [0, 10, 0, 0]
    for table in orders.tables:  # every partition got the last flush
        newest = lake.open(table).history(1)[0]
        assert json.loads(newest["deltabus.batch.note"]) == "end"
    again = bus.producer("orders", "own", commit_interval_ms=0)
    assert again.committed == 10 and again.mark("origin") == 42 and again.mark("none") is None
    again.close()


def test_a_run_of_the_older_producer_is_not_resumed(lake: Lake) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltabus.apps.timezones.contracts import INPUT_SCHEMA
    from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
    from deltabus.delta.tables import ensure_table

    dt = ensure_table(lake, "timezone1", INPUT_SCHEMA)
    rows = pa.table({"date": ["2026-03-08 07:00:00Z"], "message": ["old-0"]}, schema=INPUT_SCHEMA)
    marker = CommitProperties(app_transactions=[Transaction("deltabus-producer:old", 0)])
    write_deltalake(dt, rows, mode="append", commit_properties=marker)
    with pytest.raises(deltabus.ConfigError, match="run old was written to timezone1"):
        TimezoneProducer(lake, ProducerConfig(rate=1000, count=100, run_id="old")).run()
    assert lake.open("timezone1").to_pyarrow_table().num_rows == 1
    assert not lake.exists("timezone2")
