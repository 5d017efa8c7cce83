"""The benchmark's throwaway Kafka broker: ports outside the ephemeral range, and a start
that survives another process taking one of its ports first."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deltabus.core.errors import DeltabusError
from deltabus.core.net import ephemeral_range, port_taken, restartable_port
from deltabus_bench.kafka.broker import KafkaBroker
from tests.conftest import require_kafka


@contextmanager
def held(port: int) -> Iterator[None]:
    """Another process's listener on `port`, for the length of the block."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def test_port_pairs_lie_below_the_ephemeral_range_and_are_free() -> None:
    low, _ = ephemeral_range()
    for _ in range(20):
        port = restartable_port(span=2)
        assert 10_000 <= port and port + 1 < low
        assert not port_taken(port) and not port_taken(port + 1)


def test_broker_starts_on_a_fresh_pair_when_its_controller_port_is_taken(tmp_path: Path) -> None:
    require_kafka()
    broker = KafkaBroker(tmp_path / "kafka")
    first = broker.port
    with held(first + 1):
        try:
            broker.start()
            assert broker.port != first
            assert broker.pid is not None
            broker.create_topics(("after-retry",))
        finally:
            broker.stop()


def test_a_port_given_by_the_caller_is_not_changed(tmp_path: Path) -> None:
    require_kafka()
    port = restartable_port(span=2)
    broker = KafkaBroker(tmp_path / "kafka", port=port)
    with held(port + 1), pytest.raises(DeltabusError) as raised:
        broker.start()
    assert f"ports {port} and {port + 1} must both be free" in raised.value.hint
    assert broker.port == port
    assert broker.pid is None
