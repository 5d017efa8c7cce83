"""Deletion vectors: Z85 text, the RoaringBitmapArray format and their file names."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import numpy as np

Z85_ALPHABET = (
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)
_Z85_INDEX = {c: i for i, c in enumerate(Z85_ALPHABET)}
DV_MAGIC = 1681511377
_ROARING_COOKIE = 12347
_ROARING_COOKIE_NO_RUNS = 12346


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ Base85) to bytes; the text length is a multiple of 5."""
    if len(text) % 5:
        raise ValueError(f"Z85 text of length {len(text)}")
    out = bytearray()
    for start in range(0, len(text), 5):
        value = 0
        for ch in text[start : start + 5]:
            value = value * 85 + _Z85_INDEX[ch]
        out += value.to_bytes(4, "big")
    return bytes(out)


def _roaring32(data: bytes, pos: int) -> tuple[np.ndarray, int]:
    """One portable 32-bit Roaring bitmap at `pos`: (sorted values, position after it)."""
    (cookie,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if cookie & 0xFFFF == _ROARING_COOKIE:
        size = (cookie >> 16) + 1
        flag_bytes = (size + 7) // 8
        runs = np.unpackbits(np.frombuffer(data, np.uint8, flag_bytes, pos), bitorder="little")
        runs = runs[:size].astype(bool)
        pos += flag_bytes
        has_offsets = size >= 4
    elif cookie == _ROARING_COOKIE_NO_RUNS:
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        runs = np.zeros(size, bool)
        has_offsets = True
    else:
        raise ValueError(f"not a Roaring bitmap (cookie {cookie})")
    header = np.frombuffer(data, "<u2", 2 * size, pos).astype(np.uint32)
    pos += 4 * size
    keys, cards = header[0::2], header[1::2] + 1
    if has_offsets:
        pos += 4 * size
    parts = []
    for i in range(size):
        if runs[i]:
            (n_runs,) = struct.unpack_from("<H", data, pos)
            pos += 2
            pairs = np.frombuffer(data, "<u2", 2 * n_runs, pos).astype(np.int64)
            pos += 4 * n_runs
            starts, lengths = pairs[0::2], pairs[1::2] + 1
            firsts = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
            low = (np.arange(int(lengths.sum()), dtype=np.int64) + firsts).astype(np.uint32)
        elif cards[i] <= 4096:
            low = np.frombuffer(data, "<u2", int(cards[i]), pos).astype(np.uint32)
            pos += 2 * int(cards[i])
        else:
            bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, pos), bitorder="little")
            low = np.flatnonzero(bits).astype(np.uint32)
            pos += 8192
        parts.append(low | (keys[i] << np.uint32(16)))
    values = np.concatenate(parts) if parts else np.empty(0, np.uint32)
    return values, pos


def decode_roaring_array(data: bytes) -> np.ndarray:
    """Delta's RoaringBitmapArray: the sorted row indexes (uint64) a deletion vector hides.

    The protocol's format is a magic number then the portable 64-bit Roaring format
    (little endian). Delta Spark also reads, and once wrote, its "native" format: magic
    1681511376, a 32-bit bitmap count, then each 32-bit bitmap after its byte size, the
    bitmap's index being its upper 32 bits (the protocol's own inline example uses it,
    with big-endian header fields).
    """
    (magic,) = struct.unpack_from("<i", data, 0)
    parts = []
    if magic == DV_MAGIC:
        (buckets,) = struct.unpack_from("<q", data, 4)
        pos = 12
        for _ in range(buckets):
            (key,) = struct.unpack_from("<I", data, pos)
            values, pos = _roaring32(data, pos + 4)
            parts.append(values.astype(np.uint64) | (np.uint64(key) << np.uint64(32)))
    elif DV_MAGIC - 1 in (magic, struct.unpack_from(">i", data, 0)[0]):
        order = "<" if magic == DV_MAGIC - 1 else ">"
        (count,) = struct.unpack_from(order + "i", data, 4)
        pos = 8
        for key in range(count):
            (size,) = struct.unpack_from(order + "i", data, pos)
            values, _ = _roaring32(data, pos + 4)
            pos += 4 + size
            parts.append(values.astype(np.uint64) | (np.uint64(key) << np.uint64(32)))
    else:
        raise ValueError(f"deletion vector magic number {magic}, expected {DV_MAGIC}")
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def dv_relative_path(descriptor: dict[str, Any]) -> str:
    """File of a storageType 'u' deletion vector, relative to the table root."""
    text = descriptor["pathOrInlineDv"]
    prefix, encoded = text[:-20], text[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def dv_unique_id(descriptor: dict[str, Any] | None) -> str | None:
    if not descriptor:
        return None
    offset = descriptor.get("offset")
    base = f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
    return base if offset is None else f"{base}@{offset}"
