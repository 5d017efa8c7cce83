"""How long a consumer group's survivor takes to hold a gone member's partitions.

    .venv/bin/python -m tools.group_takeover [--rounds 5] [--partitions 4]

Uses the lake of the environment (DELTABUS_* variables, or `.env` as the CLI reads it:
`make minio` writes one). Each round declares a fresh stream, starts two members
(`deltabus consume`, real processes) that split its partitions, and times from the
moment a member goes until the other holds every partition by the lease records:

- killed: the member is SIGKILLed, so its leases must run out (the default lease time,
  `deltabus.bus.groups.DEFAULT_TTL_S`);
- departed: the member gets SIGTERM and leaves (`close()` releases its partitions).

Prints each round and the median per case, with the CPU model (`lscpu`).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
import uuid

import pyarrow as pa

import deltabus
from deltabus.bus.groups import DEFAULT_TTL_S, Group

POLL_S = 0.05
SCHEMA = pa.schema([("id", pa.int64(), False)])


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def member(stream: str, group: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "deltabus", "consume", "--stream", stream, "--group", group]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pid_of(member_id: str) -> int:
    """The process id in a member id (host-pid-suffix)."""
    return int(member_id.rsplit("-", 2)[-2])


def holders(group: Group, tables: list[str]) -> dict[str, str | None]:
    partitions = group.describe(tables)["partitions"]
    return {t: (p or {}).get("member") for t, p in partitions.items()}


def wait_until(what: str, test, timeout_s: float = 120.0) -> float:  # noqa: ANN001
    """Seconds until `test()` holds; raises after `timeout_s`."""
    start = time.monotonic()
    while not test():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(POLL_S)
    return time.monotonic() - start


def one_round(bus: deltabus.Bus, partitions: int, how: str) -> float:
    name = f"takeover_{uuid.uuid4().hex[:8]}"
    stream = bus.create_stream(name, SCHEMA, partitions=partitions)
    group = Group(bus.lake, f"g-{name}", DEFAULT_TTL_S)
    tables = list(stream.tables)
    first = member(name, group.name)
    try:
        wait_until(
            "the first member holds every partition", lambda: all(holders(group, tables).values())
        )
        second = member(name, group.name)
        try:

            def split() -> bool:
                held = holders(group, tables)
                return all(held.values()) and len(set(held.values())) == 2

            wait_until("the two members split the partitions", split)
            held = holders(group, tables)
            gone = held[tables[-1]]
            assert gone is not None
            survivor = next(m for m in held.values() if m != gone)
            victim = second if pid_of(gone) == second.pid else first
            victim.send_signal(signal.SIGKILL if how == "killed" else signal.SIGTERM)
            took = wait_until(
                "the survivor holds every partition",
                lambda: set(holders(group, tables).values()) == {survivor},
            )
            victim.wait(timeout=30)
            return took
        finally:
            second.kill()
            second.wait()
    finally:
        first.kill()
        first.wait()
        bus.delete_stream(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per case")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args(argv)
    bus = deltabus.connect()
    print(f"group takeover, lease {DEFAULT_TTL_S:g} s, {args.partitions} partitions, {cpu_model()}")
    for how in ("killed", "departed"):
        times = []
        for i in range(args.rounds):
            took = one_round(bus, args.partitions, how)
            times.append(took)
            print(f"  {how} round {i + 1}: survivor held every partition after {took:.2f} s")
        print(f"{how}: median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
