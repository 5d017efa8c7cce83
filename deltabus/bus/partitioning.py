"""Key hashing: which partition a keyed record goes to.

`crc32` (the default): CRC-32 (zlib's, IEEE 802.3) of the key's UTF-8 text, modulo the
partition count. `murmur2`: Kafka's default partitioner, `(murmur2(key) & 0x7fffffff) %
partitions` with Kafka's seed, so keys land on the same partition numbers as in a Kafka
topic with that many partitions. Keys that are bytes are hashed as they are; other keys
as the UTF-8 text of `str(key)`.
"""

from __future__ import annotations

import zlib
from typing import Literal

Partitioner = Literal["crc32", "murmur2"]
PARTITIONERS: tuple[Partitioner, ...] = ("crc32", "murmur2")

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` as a signed 32-bit integer (`Utils.murmur2`)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_partition(key: object, partitions: int, partitioner: Partitioner = "crc32") -> int:
    """The partition of a record with `key` among `partitions`, the same in every process
    and language that implements the partitioner."""
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8")
    if partitioner == "murmur2":
        return (murmur2(raw) & 0x7FFFFFFF) % partitions
    return zlib.crc32(raw) % partitions
