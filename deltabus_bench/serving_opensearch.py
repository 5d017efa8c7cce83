"""`deltabus bench --serve opensearch`: the OpenSearch index sink as the serving stage.

The node is DELTABUS_OPENSEARCH_URL (then the run serves into an index of its own,
deleted afterwards with the sink's position document), else a throwaway node on loopback
(deltabus.adapters.dev.opensearch_process), whose JVM's CPU is watched as "opensearch" and which is
warmed up first (`warm_up`: a fresh JVM indexes far slower until it has compiled its
indexing and search paths, which a serving node in use has long done). The sink
acknowledges a batch once it is searchable (`refresh=wait_for`), with up to
`--serve-in-flight` batches in flight; `--serve-refresh-ms` sets the refresh interval
(ADR 0005).

The reader stamps a version when the sink's position first covers it. Each poll reads
the position P (a real-time get); only when P has moved does it search, for the number
of documents of each version in (last P, P] (a terms aggregation, no documents fetched).
The sink writes P right after the bulk request that made those documents searchable
returns, so the stamp is the moment they became searchable plus one request. Once the
run is over, one scroll reads every document's message and version: a message is served
at its version's stamp if the count at the stamp was all of that version's documents,
and never otherwise. (Fetching each poll's documents, sorted by version and message,
took the node about a third of a core at 30k msg/s, and made the sink fall behind
there: docs/benchmarks/archive.md, "Serving: OpenSearch beside PostgreSQL".)
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.opensearch_documents import INDEX_MAPPING, ONE_SHARD, POSITION_INDEX
from deltabus.adapters.serving.opensearch_target import (
    DEFAULT_IN_FLIGHT,
    DEFAULT_REFRESH_INTERVAL_MS,
)
from deltabus_bench.config import SERVER_CPU
from deltabus_bench.serving import SERVED_SCHEMA, ServedReader, ServingRun

log = logging.getLogger("deltabus_bench")

PAGE = 10_000  # hits per search request (OpenSearch's default result window)
SCROLL = "2m"  # how long the end-of-run scan's scroll context lives between pages
WARMUP_INDEX = "deltabus_bench_warmup"
WARMUP_DOCS = 20_000
WARMUP_BULK = 2_000
WARMUP_MAX_S = 30.0
RAW_INDEX = "deltabus_bench_raw"
RAW_S = 10.0
RAW_BULK = 1_000


def _count_body(above: int, upto: int) -> dict[str, Any]:
    """The reader's poll: the number of documents of each version in (`above`, `upto`]."""
    return {
        "size": 0,
        "track_total_hits": False,
        "query": {"range": {"version": {"gt": above, "lte": upto}}},
        "aggs": {"v": {"terms": {"field": "version", "size": max(1, upto - above)}}},
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
            client.search(index=WARMUP_INDEX, body=_count_body(version - 1, version))
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
    node_pid: int | None = None,
) -> dict[str, Any]:
    """The node's own indexing rate for served documents: `in_flight` threads of one
    plain client send `_bulk` requests of `docs` external-version `index` operations
    (the sink's shape, no refresh wait) into a scratch index for `seconds`, which is
    deleted afterwards; with `node_pid`, also the node's CPU-seconds per million of them."""
    from concurrent.futures import ThreadPoolExecutor

    from deltabus_bench.environment import process_tree_cpu_s

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

    node_before = process_tree_cpu_s(node_pid) if node_pid else None
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            total = sum(pool.map(lambda _: sender(), range(in_flight)))
        elapsed = time.monotonic() - started
        node_after = process_tree_cpu_s(node_pid) if node_pid else None
    finally:
        client.indices.delete(index=RAW_INDEX, ignore_unavailable=True)
        client.close()
    return {
        "docs": total,
        "seconds": round(elapsed, 3),
        "docs_per_s": round(total / elapsed, 1),
        "in_flight": in_flight,
        "docs_per_request": docs,
        "node_cpu_s_per_million_docs": (
            round((node_after - node_before) / total * 1e6, 1)
            if node_before is not None and node_after is not None and total
            else None
        ),
    }


class OpenSearchReader(ServedReader):
    """Polls the sink's position, and when it moved, counts the documents of each version
    it passed; once the run is over, reads every document's message and version (see the
    module docstring)."""

    def __init__(self, url: str, index: str, poll_s: float) -> None:
        super().__init__(poll_s)
        self.url, self.index = url, index
        self.last = -1  # the sink's position at the previous poll
        self.client: Any = None
        self.stamped: dict[int, tuple[float, int]] = {}  # version: (when covered, its docs)
        self.documents = pa.table(
            {"message": pa.array([], pa.string()), "version": pa.array([], pa.int64())}
        )

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
        body = _count_body(self.last, position)
        buckets = self.client.search(index=self.index, body=body)["aggregations"]["v"]["buckets"]
        counts = {int(b["key"]): int(b["doc_count"]) for b in buckets}
        now = time.time() * 1000
        for version in range(self.last + 1, position + 1):
            self.stamped[version] = (now, counts.get(version, 0))
        self.last = position
        return [], sum(counts.values())

    def finish(self) -> None:
        """Read every document's message and version (a scroll, once nothing writes)."""
        if self.client is None:
            self.client = osc.client(self.url)
        messages: list[str] = []
        versions: list[int] = []
        body = {
            "size": PAGE,
            "_source": False,
            "docvalue_fields": ["message", "version"],
            "sort": ["_doc"],
        }
        page = self.client.search(index=self.index, body=body, scroll=SCROLL)
        try:
            while hits := page["hits"]["hits"]:
                messages += [hit["fields"]["message"][0] for hit in hits]
                versions += [int(hit["fields"]["version"][0]) for hit in hits]
                page = self.client.scroll(scroll_id=page["_scroll_id"], scroll=SCROLL)
        finally:
            self.client.clear_scroll(scroll_id=page["_scroll_id"])
        self.documents = pa.table(
            {"message": pa.array(messages, pa.string()), "version": pa.array(versions, pa.int64())}
        )

    def table(self) -> pa.Table:
        """Each document's message, stamped when the sink's position first covered its
        version, if every document of that version was searchable then (else unstamped:
        the position ran ahead of the index, and the message counts as never served)."""
        stamps = pa.table(
            {
                "version": pa.array(list(self.stamped), pa.int64()),
                "served_ms": pa.array([t for t, _ in self.stamped.values()], pa.float64()),
                "counted": pa.array([n for _, n in self.stamped.values()], pa.int64()),
            }
        )
        con = duckdb.connect()
        con.register("docs", self.documents)
        con.register("stamps", stamps)
        return (
            con.sql(
                """SELECT d.message, s.served_ms
               FROM docs d
               JOIN (SELECT version, count(*) AS n FROM docs GROUP BY version) c USING (version)
               JOIN stamps s USING (version)
               WHERE s.counted = c.n"""
            )
            .to_arrow_table()
            .cast(SERVED_SCHEMA)
        )

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
        self.raw_capacity = raw_capacity(
            self.url, self.refresh_interval_ms, node_pid=self.node.process.pid
        )
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
