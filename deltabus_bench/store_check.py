"""`deltabus store-check`: what a store profile delivers, as latencies of requests of each
class (GET, hedged GET, GET of a missing key, PUT, LIST) measured through its proxy."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from deltabus.core.errors import ConfigError, DeltabusError
from deltabus_bench.store_profiles import StoreProxy, profile, summarise

# -- measuring what a client sees --------------------------------------------------------

REQUEST_CLASSES = ("GET", "GET hedged", "GET 404", "PUT", "LIST")


def measure(
    settings: Any,
    requests: int,
    classes: tuple[str, ...] = REQUEST_CLASSES,
    payload_bytes: int = 1024,
) -> dict[str, dict[str, float]]:
    """Latency in ms (n, p50, p90, p99, max) per request class over `requests` requests
    each, sent one at a time in turns, through one obstore store of `settings` (one
    connection pool, as each deltabus process has): GET of a small object, GET of a
    missing one (404: a tail's poll for the next commit), the same GET hedged as the Delta
    log's hot path sends it (deltabus.core.hedge), PUT of `payload_bytes`, LIST of
    a prefix of a few objects. The objects are written under a fresh folder of
    `settings.prefix` and left there."""
    import obstore

    from deltabus.core import hedge
    from deltabus.delta.lake import Lake

    unknown = set(classes) - set(REQUEST_CLASSES)
    if unknown:
        raise ConfigError(f"unknown request classes {sorted(unknown)}", f"use {REQUEST_CLASSES}")
    store = Lake(settings).object_store
    folder = f"store-check-{uuid.uuid4().hex[:8]}"
    body = os.urandom(payload_bytes)
    for i in range(3):
        obstore.put(store, f"{folder}/list/{i}", body)
    obstore.put(store, f"{folder}/object", body)

    def get() -> None:
        obstore.get(store, f"{folder}/object").bytes()

    def hedged_get() -> None:
        hedge.get(store, f"{folder}/object")

    def missing() -> None:
        try:
            obstore.get(store, f"{folder}/missing").bytes()
        except FileNotFoundError:
            return
        raise DeltabusError("a GET of a missing object did not answer 404")

    counter = iter(range(requests))

    def put() -> None:
        obstore.put(store, f"{folder}/put/{next(counter)}", body)

    def listing() -> None:
        for _ in obstore.list(store, f"{folder}/list/"):
            pass

    calls = {"GET": get, "GET hedged": hedged_get, "GET 404": missing, "PUT": put, "LIST": listing}
    timings: dict[str, list[float]] = {name: [] for name in classes}
    for _ in range(requests):
        for name in classes:
            t0 = time.perf_counter()
            calls[name]()
            timings[name].append((time.perf_counter() - t0) * 1000)
    return {name: summarise(values) for name, values in timings.items()}


def check(name: str, settings: Any, workdir: Path, requests: int, seed: int = 0) -> dict:
    """`measure` directly on MinIO (the baseline) and through profile `name`'s proxy, with
    the profile's modelled injected delay: what `deltabus store-check` prints."""
    chosen = profile(name)
    direct = measure(settings, requests)
    out: dict[str, Any] = {
        "store": chosen.describe(),
        "requests_per_class": requests,
        "client": "obstore (one store, one connection pool; requests one at a time)",
        "direct": direct,
    }
    if chosen.proxied:
        with StoreProxy(chosen, settings.minio_endpoint, workdir, seed=seed) as proxy:
            out["through_proxy"] = measure(
                settings.model_copy(update={"minio_endpoint": proxy.endpoint}), requests
            )
        out["modelled_injected"] = chosen.modelled_ms(seed=seed)
        if proxy.tail_counts is not None:
            out["tail_stage"] = proxy.tail_counts
    return out


def check_markdown(result: dict) -> str:
    """`check`'s result as a Markdown table: ms per request class."""
    store = result["store"]
    lines = [
        f"store profile {store['profile']}: {store['summary']}",
        f"{result['requests_per_class']} requests per class; client: {result['client']}",
        "",
        "| path | request | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for path in ("direct", "through_proxy"):
        for name, s in (result.get(path) or {}).items():
            label = "MinIO direct" if path == "direct" else f"through {store['profile']}"
            lines.append(
                f"| {label} | {name} | {s['p50']} | {s['p90']} | {s['p99']} | {s['max']} |"
            )
    model = result.get("modelled_injected")
    if model:
        lines.append(
            f"| modelled injected delay | any | {model['p50']} | {model['p90']} "
            f"| {model['p99']} | {model['max']} |"
        )
    if result.get("tail_stage"):
        t = result["tail_stage"]
        lines += ["", f"tail stage: {t['delayed']} of {t['requests']} requests delayed"]
    return "\n".join(lines)
