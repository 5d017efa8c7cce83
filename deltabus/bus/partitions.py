"""Partitioned streams: a stream of P partitions is P Delta tables, one log each.

One Delta log takes a few dozen commits a second; a stream that needs more is split, as a
Kafka topic is, into P partitions, each its own table with its own log, named
`<stream>-p0` … `<stream>-p{P-1}` (the stream's own name when P = 1).
"""

from __future__ import annotations

MAX_PARTITIONS = 64


def partition_table(stream: str, partition: int, partitions: int) -> str:
    """The table of one partition of `stream` (the stream's own name when P = 1)."""
    return stream if partitions == 1 else f"{stream}-p{partition}"
