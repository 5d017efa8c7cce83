"""The indexed copy of the net content and the sink's position in OpenSearch.

OpenSearch has no transaction across documents, so exactly once rests on versions
(docs/adr/0005-opensearch-sink.md): every document write is a `_bulk` operation with
`version_type=external` and, as its version, the unified version that last changed the
message, so a batch replayed after a crash changes nothing it had already written, and a
document never goes back to an older state. The position, the last unified version whose
changes are all in the index, is one document of `deltabus_sink_position` (id: the
sink's name), replaced after a batch's bulk requests were acknowledged, only if no other
writer changed it meanwhile (`if_seq_no`, `if_primary_term`). Up to `in_flight` batches
are sent at once, and their position writes happen in order (`BulkPipeline`).

Bulk requests wait for a refresh (`refresh=wait_for`) on an index created with an
explicit `refresh_interval`, so an acknowledged batch is searchable and the index never
goes search-idle. What a document holds, and its `_id`: `opensearch_documents`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.bulk_pipeline import BulkPipeline
from deltabus.adapters.serving.changes import final_changes
from deltabus.adapters.serving.opensearch_documents import (
    BULK_OPERATIONS,
    INDEX_MAPPING,
    INDEXED_FIELDS,
    ONE_SHARD,
    POSITION_INDEX,
    POSITION_MAPPING,
    bulk_bodies,
    check_index_name,
    document_id,
    index_operations,
    raise_unread,
    split_changes,
    to_json,
)
from deltabus.adapters.serving.sink_loop import Applied, PositionMovedError
from deltabus.core.errors import ConfigError, DeltabusError

log = logging.getLogger(__name__)

# The served index's refresh interval (docs/adr/0005-opensearch-sink.md).
DEFAULT_REFRESH_INTERVAL_MS = 200
# Batches whose bulk requests are in flight at once; 1 sends each after the last one's
# refresh (docs/adr/0005-opensearch-sink.md).
DEFAULT_IN_FLIGHT = 4


@dataclass(frozen=True)
class StoredPosition:
    """The position document as read, with what a compare-and-set write needs."""

    source: dict[str, Any]
    seq_no: int
    primary_term: int

    @property
    def version(self) -> int:
        return int(self.source["version"])


class OpenSearchTarget:
    """One served index and its sink's position document, over one client."""

    system = "OpenSearch"

    def __init__(
        self,
        url: str,
        index: str,
        source: str,
        sink: str | None = None,
        refresh_interval_ms: int = DEFAULT_REFRESH_INTERVAL_MS,
        in_flight: int = DEFAULT_IN_FLIGHT,
    ) -> None:
        self.url = url
        self.index = check_index_name(index)
        self.sink = sink or index
        self.source = source  # the Delta table served, by URI: one source per sink
        self.refresh_interval = f"{int(refresh_interval_ms)}ms"
        self.in_flight = in_flight
        self.client: Any = None
        self._pipeline: BulkPipeline | None = None
        self._stored: StoredPosition | None = None  # as the last position write left it
        self._queued = -1  # the version the last batch queued moves the position to

    def describe(self) -> str:
        return f"index {self.index} on {osc.describe(self.url)}"

    def recreated_hint(self) -> str:
        return (
            f"delete the index {self.index} and the document {self.sink} of "
            f"{POSITION_INDEX} to serve the new table from its start"
        )

    def is_transient(self, exc: BaseException) -> bool:
        return osc.is_transient(exc)

    def user_error(self, exc: BaseException) -> DeltabusError | None:
        return osc.user_error(exc, self.url)

    def redact(self, text: str) -> str:
        return osc.redact(text, self.url)

    def changes(self, rows: pa.Table | None) -> pl.DataFrame:
        return final_changes(rows)

    # -- connection and indices -----------------------------------------------------------

    def open(self, checked: bool = True) -> None:
        """Connect and make sure both indices exist with their mappings. `checked`: a
        problem becomes one clear error (start); otherwise the client's errors pass
        through to be retried."""
        self.close()
        self.client = osc.client(self.url)
        try:
            if checked:
                osc.check_usable(self.client, self.url, [self.index, POSITION_INDEX])
            self._prepare()
        except Exception as exc:
            error = osc.user_error(exc, self.url) if checked else None
            self.close()
            if error is not None:
                raise error from None
            raise

    def connected(self) -> bool:
        return self.client is not None

    def close(self) -> None:
        """Wait for the batches in flight (their failures are dropped: a reconnect reads
        the position back), then close the client."""
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        self._stored = None
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - a dead connection has nothing to close
                pass
            self.client = None

    def _create(self, name: str, mapping: dict, settings: dict) -> bool:
        """Create index `name` unless it exists; True when this call created it."""
        from opensearchpy.exceptions import RequestError

        if self.client.indices.exists(index=name):
            return False
        try:
            self.client.indices.create(
                index=name, body={"settings": {"index": settings}, "mappings": mapping}
            )
        except RequestError as exc:
            if exc.error != "resource_already_exists_exception":  # created meanwhile
                raise
            return False
        return True

    def _prepare(self) -> None:
        self._create(POSITION_INDEX, POSITION_MAPPING, ONE_SHARD)
        settings = ONE_SHARD | {"refresh_interval": self.refresh_interval}
        created = self._create(self.index, INDEX_MAPPING, settings)
        if not created:
            self._check_mapping()
            current = self.client.indices.get_settings(
                index=self.index, name="index.refresh_interval"
            )
            held = current.get(self.index, {}).get("settings", {}).get("index", {})
            if held.get("refresh_interval") != self.refresh_interval:
                self.client.indices.put_settings(
                    index=self.index, body={"index": {"refresh_interval": self.refresh_interval}}
                )
        read = self._read_position()
        if read is None:
            if self.count() > 0:
                raise ConfigError(
                    f"{self.describe()} has documents but no position in {POSITION_INDEX}: "
                    "the sink cannot tell which changes they hold",
                    "delete that index, or serve into another --index",
                )
            self._create_position()
            return
        if created and (read.version >= 0 or read.source.get("snapshot_version") is not None):
            self.client.indices.delete(index=self.index)  # as it was: no index, a position
            raise ConfigError(
                f"{self.describe()} was deleted, but its position in {POSITION_INDEX} "
                f"(version {read.version}) was kept: the sink cannot tell what is missing",
                f"delete the document {self.sink} of {POSITION_INDEX} too; the next start "
                "loads the index afresh",
            )
        if read.source.get("source_table") != self.source:
            raise ConfigError(
                f"{self.describe()} serves {read.source.get('source_table')}, not {self.source}",
                "serve this lake into another --index, or delete that index and the "
                f"document {self.sink} of {POSITION_INDEX}",
            )

    def _check_mapping(self) -> None:
        mappings = self.client.indices.get_mapping(index=self.index)
        properties = mappings.get(self.index, {}).get("mappings", {}).get("properties", {})
        found = {name: spec.get("type") for name, spec in properties.items()}
        if found != INDEXED_FIELDS:
            raise ConfigError(
                f"{self.describe()} exists with other fields ({found}) than a served index "
                f"({INDEXED_FIELDS})",
                "serve into another --index, or delete that index",
            )

    # -- the position ---------------------------------------------------------------------

    def _read_position(self) -> StoredPosition | None:
        """The position document, read in real time (not waiting for a refresh)."""
        from opensearchpy.exceptions import NotFoundError

        try:
            found = self.client.get(index=POSITION_INDEX, id=self.sink)
        except NotFoundError:
            return None
        if not found.get("found"):
            return None
        return StoredPosition(found["_source"], found["_seq_no"], found["_primary_term"])

    def _create_position(self) -> None:
        """The position document of a fresh sink (-1), unless one exists."""
        from opensearchpy.exceptions import ConflictError

        try:
            self.client.index(
                index=POSITION_INDEX,
                id=self.sink,
                body=self._position_body(-1, None, None),
                op_type="create",
            )
        except ConflictError:
            pass  # another sink of the same name created it meanwhile

    def _replace_position(
        self, read: StoredPosition, body: dict[str, Any]
    ) -> StoredPosition | None:
        """Write the position document if it is still as `read` found it (compare and
        set on its sequence number): the document as written, or None when another
        writer changed it."""
        from opensearchpy.exceptions import ConflictError

        try:
            written = self.client.index(
                index=POSITION_INDEX,
                id=self.sink,
                body=body,
                if_seq_no=read.seq_no,
                if_primary_term=read.primary_term,
            )
        except ConflictError:
            return None
        return StoredPosition(body, written["_seq_no"], written["_primary_term"])

    def _position_body(
        self, version: int, snapshot_version: int | None, source_commit_ms: int | None
    ) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "source_table": self.source,
            "version": version,
            "snapshot_version": snapshot_version,
            "source_commit_ms": source_commit_ms,
            "updated_at": int(time.time() * 1000),
        }

    def _position_deleted(self) -> ConfigError:
        return ConfigError(
            f"the position of {self.describe()} was deleted while the sink ran",
            f"delete the index {self.index} too, and start the sink again to load it afresh",
        )

    def position(self) -> int:
        """The last unified version applied (-1: none yet)."""
        read = self._read_position()
        return -1 if read is None else read.version

    def snapshot_version(self, latest: int) -> int:
        """The version a fresh sink loads: the one recorded by an earlier start whose
        snapshot did not finish (loading it again rewrites the same documents, and
        leaves none of another version behind), else `latest`, recorded now."""
        read = self._read_position()
        if read is None:
            raise self._position_deleted()
        recorded = read.source.get("snapshot_version")
        if recorded is None:
            body = self._position_body(-1, latest, None)
            if self._replace_position(read, body) is not None:
                return latest
            reread = self._read_position()
            recorded = None if reread is None else reread.source.get("snapshot_version")
        if recorded is None or int(recorded) > latest:
            raise ConfigError(
                f"{self.describe()} was being loaded from version {recorded} of "
                f"{self.source}, which only has {latest}: the unified table was re-created",
                self.recreated_hint(),
            )
        return int(recorded)

    def count(self) -> int:
        return int(self.client.count(index=self.index)["count"])

    # -- writing --------------------------------------------------------------------------

    def apply(
        self, changes: pl.DataFrame, expected: int, to_version: int, source_commit_ms: int
    ) -> Applied:
        """Apply `changes` (`final_changes`) with external versions, then move
        the position from `expected` to `to_version` (compare and set). Raises
        PositionMovedError when another sink moved it: before the writes, nothing is
        written; after them, what they changed is what their versions allowed."""
        read = self._position_at(expected)
        inserts, retracted = split_changes(changes)
        deletes, not_held = self._deletes(retracted)
        indexed, deleted, already = self._bulk(index_operations(inserts) + deletes)
        snapshot = to_version if expected < 0 else None
        body = self._position_body(to_version, snapshot, source_commit_ms)
        written = self._replace_position(read, body)
        if written is None:
            raise PositionMovedError(self.position())
        self._stored, self._queued = written, to_version
        return Applied(indexed, deleted, time.time() * 1000, already_applied=already + not_held)

    def submit(
        self,
        changes: pl.DataFrame,
        expected: int,
        to_version: int,
        source_commit_ms: int,
        done: Callable[[Applied], None],
    ) -> None:
        """`apply` with up to `in_flight` batches' bulk requests in flight: `done` gets
        the batch's Applied once its position was written, after every earlier batch's.
        A failure or a moved position surfaces at a later `submit`, `check` or `drain`.
        A snapshot, and a batch with deletes (which read what earlier batches wrote),
        first wait for the batches in flight."""
        inserts, retracted = split_changes(changes)
        if self.in_flight <= 1 or expected < 0 or retracted.height > 0:
            done(self.apply(changes, expected, to_version, source_commit_ms))
            return
        pipeline = self._pipeline_open()
        pipeline.check()
        if self._stored is None or self._queued != expected:
            self._stored, self._queued = self._position_at(expected), expected
        operations = index_operations(inserts)
        body = self._position_body(to_version, None, source_commit_ms)

        def commit(counts: tuple[int, int, int]) -> None:
            assert self._stored is not None  # set before the first batch was queued
            written = self._replace_position(self._stored, body)
            if written is None:
                raise PositionMovedError(self.position())
            self._stored = written
            indexed, deleted, already = counts
            done(Applied(indexed, deleted, time.time() * 1000, already_applied=already))

        self._queued = to_version
        pipeline.submit(lambda: self._bulk(operations), commit)

    def _position_at(self, expected: int) -> StoredPosition:
        """The position document once no batch is in flight; PositionMovedError unless
        it holds `expected`."""
        self.drain()
        read = self._read_position()
        if read is None:
            raise self._position_deleted()
        if read.version != expected:
            raise PositionMovedError(read.version)
        return read

    def check(self) -> None:
        """Raise the failure of a batch in flight that ended since the last call."""
        if self._pipeline is not None:
            self._pipeline.check()

    def drain(self) -> None:
        """Wait until every batch in flight has moved the position (or raise its failure)."""
        if self._pipeline is not None:
            self._pipeline.drain()

    def _pipeline_open(self) -> BulkPipeline:
        if self._pipeline is None:
            self._pipeline = BulkPipeline(self.in_flight, name="opensearch-bulk")
        return self._pipeline

    def _deletes(self, retracted: pl.DataFrame) -> tuple[list[tuple[str, str | None]], int]:
        """Delete operations for the retracted messages whose document holds a retracted
        timestamp at an older version; and how many were already gone or newer."""
        if retracted.height == 0:
            return [], 0
        wanted: dict[str, tuple[set[float], int]] = {}
        for message, timestamp, version in retracted.select(
            "message", "timestamp", "version"
        ).iter_rows():
            stamps, newest = wanted.get(message, (set(), -1))
            wanted[message] = (stamps | {timestamp}, max(newest, version))
        messages = list(wanted)
        operations: list[tuple[str, str | None]] = []
        skipped = 0
        for start in range(0, len(messages), BULK_OPERATIONS):
            part = messages[start : start + BULK_OPERATIONS]
            ids = [document_id(m) for m in part]
            docs = self.client.mget(
                index=self.index, body={"ids": ids}, _source_includes="timestamp"
            )["docs"]
            raise_unread(docs)
            for message, doc_id, doc in zip(part, ids, docs, strict=True):
                stamps, version = wanted[message]
                held = doc.get("found") and doc["_source"].get("timestamp") in stamps
                if not held or int(doc["_version"]) >= version:
                    skipped += 1  # gone, newer, or holding another row of the message
                    continue
                meta = {"_id": doc_id, "version": version, "version_type": "external"}
                operations.append((to_json({"delete": meta}), None))
        return operations, skipped

    def _bulk(self, operations: list[tuple[str, str | None]]) -> tuple[int, int, int]:
        """Send `operations` to the served index; (indexed, deleted, already applied).
        The last request waits for the refresh that makes them all searchable."""
        indexed = deleted = already = 0
        bodies = list(bulk_bodies(operations))
        for n, body in enumerate(bodies):
            refresh = "wait_for" if n == len(bodies) - 1 else "false"
            answer = self.client.bulk(body=body, index=self.index, refresh=refresh)
            failures: list[tuple[int, str]] = []
            for item in answer["items"]:
                ((action, result),) = item.items()
                status = int(result["status"])
                if status in (200, 201):
                    if action == "delete":
                        deleted += 1
                    else:
                        indexed += 1
                elif status == 409 or (action == "delete" and status == 404):
                    already += 1  # an equal or newer version is there, or it is gone
                else:
                    error = result.get("error") or {}
                    failures.append((status, f"{error.get('type')}: {error.get('reason')}"))
            if failures:
                raise osc.BulkItemsFailed([s for s, _ in failures], failures[0][1])
        return indexed, deleted, already
