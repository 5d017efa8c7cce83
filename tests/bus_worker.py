"""A producer or consumer-group member of the `orders` stream, as a separate process, for
tests that SIGKILL one. Uses the public API only; the lake comes from the environment.

    python -m tests.bus_worker produce ID COUNT       # orders ID*10^9 + offset, keyed
    python -m tests.bus_worker consume GROUP OUT_FILE # one JSON line per batch
    python -m tests.bus_worker transform              # orders -> orders_eur, every partition
"""

from __future__ import annotations

import json
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc

import deltabus

ORDERS_SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("amount", pa.float64()),
        ("ts", pa.timestamp("ms", "UTC")),
        ("customer", pa.string()),
    ]
)
ID_BASE = 10**9
BATCH = 200


def order(producer: int, offset: int) -> dict:
    return {
        "order_id": producer * ID_BASE + offset,
        "amount": round(offset * 0.25, 2),
        "ts": 1_700_000_000_000 + offset,
        "customer": f"customer-{offset % 13}",
    }


def produce(producer: int, count: int) -> None:
    bus = deltabus.connect()
    with bus.producer("orders", f"producer-{producer}", commit_interval_ms=50) as p:
        print(json.dumps({"resumed_at": p.committed}), flush=True)
        offset = p.committed
        while offset < count:
            upto = min(count, offset + BATCH)
            rows = pa.Table.from_pylist([order(producer, o) for o in range(offset, upto)])
            p.send_batch(rows)
            offset = upto
            print(json.dumps({"sent": offset, "committed": p.committed}), flush=True)
            time.sleep(0.02)
    print(json.dumps({"done": count}), flush=True)


def consume(group: str, out: str) -> None:
    bus = deltabus.connect()
    with bus.consumer("orders", group=group, ttl_s=3.0) as c, open(out, "a") as sink:
        print(json.dumps({"member": c.member}), flush=True)
        while True:
            batch = c.poll(0.5)
            if batch is None:
                continue
            line = {
                "member": c.member,
                "partition": batch.partition,
                "version": batch.version,
                "ids": batch.rows.column("order_id").to_pylist(),
                "diff": batch.rows.column("diff").to_pylist(),
            }
            sink.write(json.dumps(line) + "\n")
            sink.flush()


EUR_SCHEMA = pa.schema(
    [("order_id", pa.int64()), ("amount_eur", pa.float64()), ("customer", pa.string())]
)


def to_eur(rows: pa.Table, source: deltabus.Source) -> pa.Table:
    """Orders in euros; a retracted order (diff -1) is left out."""
    kept = rows.filter(pc.greater(rows.column("diff"), 0))
    return pa.table(
        {
            "order_id": kept.column("order_id"),
            "amount_eur": pc.multiply(kept.column("amount"), 0.9),
            "customer": kept.column("customer"),
        }
    )


def transform() -> None:
    bus = deltabus.connect()
    partitions = bus.stream("orders").partitions
    parts = [bus.transform("eur", "orders", "orders_eur", p, to_eur) for p in range(partitions)]
    while True:
        covered = sum(t.step() for t in parts)
        if covered:
            print(json.dumps({"covered": covered}), flush=True)
        else:
            time.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "transform":
        transform()
    else:
        consume(sys.argv[2], sys.argv[3])
