"""A throwaway loopback MinIO and a lake on it, for the measurement tools."""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import obstore

from deltabus.adapters.dev.minio_process import MinioServer, find_minio
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake


@contextmanager
def scratch_lake(name: str, prefix: str) -> Iterator[tuple[Lake, Path]]:
    """A MinIO on a free loopback port with random credentials in a fresh temporary
    directory, its bucket `bench` created; yields the lake under `prefix` and the
    directory, and stops the MinIO afterwards."""
    binary = find_minio()
    if binary is None:
        raise SystemExit("no MinIO binary: run `make minio-bin` first")
    work = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    server = MinioServer(
        work / "minio",
        access_key="bench-" + secrets.token_hex(4),
        secret_key=secrets.token_urlsafe(18),
        binary=binary,
    )
    server.start()
    try:
        settings = Settings(
            storage="minio",
            minio_endpoint=server.endpoint,
            access_key=server.access_key,
            secret_key=server.secret_key,
            bucket="bench",
            prefix=prefix,
        )
        lake = Lake(settings)
        lake.init_bucket()
        yield lake, work
    finally:
        server.stop()


def put_objects(lake: Lake, keys: list[str], size: int) -> None:
    """Write one random body of `size` bytes under each of `keys`, 16 requests at a time."""
    body = os.urandom(size)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: obstore.put(lake.object_store, key, body), keys))
