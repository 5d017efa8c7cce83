"""`deltabus bench --serve opensearch`: the OpenSearch index sink as the serving stage.

The node is DELTABUS_OPENSEARCH_URL (then the run serves into an index of its own,
deleted afterwards with the sink's position document), else a throwaway node on loopback
(deltabus.adapters.dev.opensearch_process), whose JVM's CPU is watched as "opensearch" and which is
warmed up first (`warm_up`: a fresh JVM indexes far slower until it has compiled its
indexing and search paths, which a serving node in use has long done). The sink
acknowledges a batch once it is searchable (`refresh=wait_for`) and sends the next one
after, so the stage takes about two to three refresh intervals (ADR 0005);
`--serve-refresh-ms` sets the interval.

The reader stamps a message when the sink's position first covers it. Each poll reads
the position P (a real-time get); only when P has moved does it search, for the
documents of versions in (last P, P], sorted by (version, message) and paged with
`search_after`. The sink writes P right after the bulk request that made those documents
searchable returns, so the stamp is the moment they became searchable plus one request,
and each document is returned, and counted, once. (Searching every poll for everything
above the last P instead re-sorted a second of documents fifty times a second, and that
reader alone took more than a core of the node's CPU at 10k msg/s.)
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.opensearch_documents import INDEX_MAPPING, ONE_SHARD, POSITION_INDEX
from deltabus.adapters.serving.opensearch_target import (
    DEFAULT_IN_FLIGHT,
    DEFAULT_REFRESH_INTERVAL_MS,
)
from deltabus_bench.serving import SERVER_CPU, ServedReader, ServingRun

log = logging.getLogger("deltabus_bench")

PAGE = 10_000  # hits per search request (OpenSearch's default result window)
WARMUP_INDEX = "deltabus_bench_warmup"
WARMUP_DOCS = 20_000
WARMUP_BULK = 2_000
WARMUP_MAX_S = 30.0
RAW_INDEX = "deltabus_bench_raw"
RAW_S = 10.0
RAW_BULK = 1_000


def _search_body(above: int, upto: int) -> dict[str, Any]:
    """The reader's search: documents of versions in (`above`, `upto`], by (version,
    message)."""
    return {
        "size": PAGE,
        "_source": False,
        "track_total_hits": False,
        "query": {"range": {"version": {"gt": above, "lte": upto}}},
        # Bench messages are short, so each has a keyword value to sort by.
        "sort": [{"version": "asc"}, {"message": "asc"}],
    }


def warm_up(url: str, refresh_interval_ms: int) -> int:
    """Index documents shaped like served ones into a scratch index in bulk requests of
    the sink's kind, search them as the reader does, then delete the index; stops after
    WARMUP_DOCS documents or WARMUP_MAX_S seconds. Returns how many were indexed."""
    client = osc.client(url)
    settings = ONE_SHARD | {"refresh_interval": f"{refresh_interval_ms}ms"}
    try:
        client.indices.create(
            index=WARMUP_INDEX, body={"settings": {"index": settings}, "mappings": INDEX_MAPPING}
        )
        deadline = time.monotonic() + WARMUP_MAX_S
        done = 0
        while done < WARMUP_DOCS and time.monotonic() < deadline:
            version = 1 + done // WARMUP_BULK
            lines = []
            for i in range(done, done + WARMUP_BULK):
                meta = {"_id": f"warmup-{i}", "version": version, "version_type": "external"}
                doc = {"message": f"warmup-{i}", "timestamp": i / 1000, "time": i}
                lines += [json.dumps({"index": meta}), json.dumps(doc | {"version": version})]
            client.bulk(body="\n".join(lines) + "\n", index=WARMUP_INDEX, refresh="wait_for")
            client.search(index=WARMUP_INDEX, body=_search_body(version - 1, version))
            done += WARMUP_BULK
        return done
    finally:
        client.indices.delete(index=WARMUP_INDEX, ignore_unavailable=True)
        client.close()


def raw_capacity(
    url: str,
    refresh_interval_ms: int,
    seconds: float = RAW_S,
    in_flight: int = DEFAULT_IN_FLIGHT,
    docs: int = RAW_BULK,
) -> dict[str, Any]:
    """The node's own indexing rate for served documents: `in_flight` threads of one
    plain client send `_bulk` requests of `docs` external-version `index` operations
    (the sink's shape, no refresh wait) into a scratch index for `seconds`, which is
    deleted afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    client = osc.client(url)
    settings = ONE_SHARD | {"refresh_interval": f"{refresh_interval_ms}ms"}
    client.indices.create(
        index=RAW_INDEX, body={"settings": {"index": settings}, "mappings": INDEX_MAPPING}
    )
    counter = iter(range(1, 1 << 62))
    deadline = time.monotonic() + seconds

    def sender() -> int:
        sent = 0
        while time.monotonic() < deadline:
            version = next(counter)
            lines = []
            for i in range(docs):
                message = f"raw-{version}-{i}"
                meta = {"_id": message, "version": version, "version_type": "external"}
                doc = {"message": message, "timestamp": i / 1000, "time": i, "version": version}
                lines += [json.dumps({"index": meta}), json.dumps(doc)]
            answer = client.bulk(body="\n".join(lines) + "\n", index=RAW_INDEX)
            if answer.get("errors"):
                raise RuntimeError("raw _bulk: some operations failed")
            sent += docs
        return sent

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            total = sum(pool.map(lambda _: sender(), range(in_flight)))
        elapsed = time.monotonic() - started
    finally:
        client.indices.delete(index=RAW_INDEX, ignore_unavailable=True)
        client.close()
    return {
        "docs": total,
        "seconds": round(elapsed, 3),
        "docs_per_s": round(total / elapsed, 1),
        "in_flight": in_flight,
        "docs_per_request": docs,
    }


class OpenSearchReader(ServedReader):
    """Polls the sink's position, and when it moved, the served index for the documents
    of the versions it passed (see the module docstring)."""

    def __init__(self, url: str, index: str, poll_s: float) -> None:
        super().__init__(poll_s)
        self.url, self.index = url, index
        self.last = -1  # the sink's position at the previous poll
        self.client: Any = None

    def _position(self) -> int:
        """The sink's position: its last unified version whose documents are searchable."""
        from opensearchpy.exceptions import NotFoundError

        try:
            found = self.client.get(index=POSITION_INDEX, id=self.index)
        except NotFoundError:
            return -1
        return int(found["_source"]["version"]) if found.get("found") else -1

    def poll(self) -> tuple[list[str], int]:
        if self.client is None:
            self.client = osc.client(self.url)
        position = self._position()
        if position <= self.last:
            return [], 0  # nothing newly searchable: no search
        found: list[str] = []
        after: list[Any] | None = None
        while True:
            body = _search_body(self.last, position)
            if after is not None:
                body["search_after"] = after
            hits = self.client.search(index=self.index, body=body)["hits"]["hits"]
            found += [hit["sort"][1] for hit in hits]
            if len(hits) < PAGE:
                break
            after = hits[-1]["sort"]
        self.last = position
        return found, len(found)

    def is_transient(self, exc: BaseException) -> bool:
        return osc.is_transient(exc)

    def reset(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - a dead connection has nothing to close
                pass
            self.client = None


class OpenSearchServingRun(ServingRun):
    """`--serve opensearch`: a throwaway node unless DELTABUS_OPENSEARCH_URL is set (then
    an index of this run's own), the sink with the run's refresh interval, the reader."""

    backend = "opensearch"
    rows_key = "indexed_docs"

    def __init__(
        self,
        settings: Any,
        work: Path,
        tag: str,
        poll_s: float,
        refresh_interval_ms: int | None = None,
        in_flight: int | None = None,
    ) -> None:
        super().__init__(settings, work, tag, poll_s)
        self.refresh_interval_ms = refresh_interval_ms or DEFAULT_REFRESH_INTERVAL_MS
        self.in_flight = in_flight or DEFAULT_IN_FLIGHT
        self.node: Any = None
        if settings.opensearch_url is not None:
            self.url = settings.opensearch_url.get_secret_value()
            self.index = f"served_bench_{uuid.uuid4().hex[:8]}"
        else:
            self.url, self.index = "", "served_unified"

    def _start_store(self, cpu: Any) -> None:
        if self.url:
            return
        from deltabus.adapters.dev.opensearch_process import OpenSearchNode

        self.node = OpenSearchNode().start()
        self.url = self.node.url
        started = time.monotonic()
        docs = warm_up(self.url, self.refresh_interval_ms)
        log.info("OpenSearch warmed up: %d documents in %.1f s", docs, time.monotonic() - started)
        self.raw_capacity = raw_capacity(self.url, self.refresh_interval_ms)
        log.info(
            "OpenSearch alone: %.0f documents/s in plain _bulk requests (%d in flight)",
            self.raw_capacity["docs_per_s"],
            self.raw_capacity["in_flight"],
        )
        cpu.watch(SERVER_CPU["opensearch"], self.node.process.pid, tree=True)

    @property
    def target(self) -> str:
        return self.index

    def _sink_options(self, target: str) -> list[str]:
        return [
            "--index",
            target,
            "--refresh-interval-ms",
            str(self.refresh_interval_ms),
            "--in-flight",
            str(self.in_flight),
        ]

    def _server_pid(self) -> int | None:
        return self.node.process.pid if self.node is not None else None

    def _sink_env(self) -> dict[str, str]:
        return {"DELTABUS_OPENSEARCH_URL": self.url}

    def _make_reader(self) -> ServedReader:
        return OpenSearchReader(self.url, self.index, self.poll_s)

    def redact(self, text: str) -> str:
        return osc.redact(text, self.url)

    def _remove_store(self) -> None:
        """The throwaway node with its directory; on a configured cluster, this run's
        index and the sink's position document."""
        if self.node is not None:
            self.node.cleanup()
            return
        if not self.url:
            return
        client = osc.client(self.url)
        try:
            for index in (self.index, f"{self.index}_replay"):
                client.indices.delete(index=index, ignore_unavailable=True)
                client.delete(index=POSITION_INDEX, id=index, ignore=[404])
        except Exception as exc:  # noqa: BLE001 - the run's figures stand; say what is left
            log.warning(
                "could not remove the index %s and its position from %s: %s",
                self.index,
                osc.describe(self.url),
                self.redact(str(exc)),
            )
        finally:
            client.close()
