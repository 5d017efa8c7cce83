"""Hedged GETs through the s3-standard store profile (toxiproxy and the tail stage in front
of the real MinIO fixture): every answer is the object's bytes, a missing key is still a
404, only GETs slower than the store's recent p95 get a second request, and a lake with
hedge_reads off sends each GET once. Creating PUTs: every object created with our bytes,
ours already there is a success, a rival's refuses."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, PreconditionError

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.core import hedge
from deltabus.delta.lake import Lake
from deltabus_bench.store_profiles import PROFILES, StoreProxy
from tests.conftest import minio_settings_for

GETS = 300
PUTS = 60


def _lake(minio: MinioServer, proxy: StoreProxy, **extra: object) -> Lake:
    settings = minio_settings_for(minio, f"hedge-{uuid.uuid4().hex[:8]}", **extra)
    return Lake(settings.model_copy(update={"minio_endpoint": proxy.endpoint}))


def test_hedged_gets_through_a_store_with_a_tail(
    minio: MinioServer, toxiproxy: Path, tmp_path: Path
) -> None:
    body = os.urandom(2048)
    with StoreProxy(
        PROFILES["s3-standard"], minio.endpoint, tmp_path, seed=5, binary=toxiproxy
    ) as proxy:
        lake = _lake(minio, proxy)
        store = lake.object_store
        obstore.put(store, "object", body)
        timer = hedge.timer_of(store)
        assert timer.enabled
        answers = [hedge.get(store, "object") for _ in range(GETS)]
        with pytest.raises(FileNotFoundError):
            hedge.get(store, "missing")
        for i in range(PUTS):
            hedge.put_new(store, f"new/{i}", body)
        created = [hedge.get(store, f"new/{i}") for i in range(PUTS)]
        hedge.put_new(store, "new/0", body)  # our own bytes already there: created
        with pytest.raises((AlreadyExistsError, PreconditionError)):
            hedge.put_new(store, "new/0", b"a rival's commit")
        puts = hedge.timer_of(store, "PUT")

        plain = _lake(minio, proxy, hedge_reads=False)
        obstore.put(plain.object_store, "object", body)
        plain_timer = hedge.timer_of(plain.object_store)
        assert [hedge.get(plain.object_store, "object") for _ in range(20)] == [body] * 20
    assert answers == [body] * GETS
    assert created == [body] * PUTS
    assert puts.sent == PUTS + 2 and puts.hedged < 0.25 * PUTS, (puts.sent, puts.hedged)
    # The delay follows the profile (15-34 ms injected per request, p95 near 33 ms), and
    # the tail (3 % of requests) and the slowest base requests are what gets hedged.
    assert 0.015 <= timer.after_s <= 0.2, timer.after_s
    assert 0 < timer.hedged < 0.2 * GETS, (timer.hedged, GETS)
    assert timer.sent == GETS + 1 + PUTS
    assert not plain_timer.enabled and plain_timer.hedged == plain_timer.sent == 0
    requests = proxy.tail_counts  # counted by the tail stage, read once it stopped
    assert requests is not None and requests["requests"] >= GETS + timer.hedged
