"""Pathway on deltabus streams, with no licence key: a stream read as one Pathway row per
partition commit, and such rows written to another stream, exactly once.

    link = Link(bus, "eur", source="orders", target="orders_eur")
    batches = link.read()                      # partition, version, rows (Arrow)
    link.write(batches.select(partition=pw.this.partition, version=pw.this.version,
                              rows=to_eur(pw.this.rows)))
    pw.run()

Each row's `rows` wraps an Arrow table: the source's columns and `diff` (+1, or -1 for a
row another writer deleted or updated). A Pathway program maps it to the target's
columns (a `pw.udf` over the wrapped table). The writer commits, per partition and
Pathway time, the rows of the versions it got, together with the next source version
of that partition, in one Delta commit of the target's partition table; the reader of a
restarted program starts after those positions. So every source commit reaches the
target exactly once, whenever the program dies, as long as each output row comes from
one input row (a map, a filter): positions travel in the rows. Like the time-zone ETL,
this costs the engine one row per commit, not per record
(docs/adr/0010-one-pathway-row-per-input-version.md).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pathway as pw
import pyarrow as pa

from deltabus.bus.client import Bus
from deltabus.bus.streams import Stream
from deltabus.bus.tail import DeltaLogTail
from deltabus.bus.writers import close_writers, open_writers
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.tables import metadata

log = logging.getLogger(__name__)


class StreamBatch(pw.Schema):
    """One commit of one partition: its rows as a wrapped Arrow table."""

    partition: int
    version: int
    rows: pw.PyObjectWrapper


class Link:
    """A Pathway program from stream `source` to stream `target`, named `name`.

    Args:
        bus: the lake both streams are declared in.
        name: the link's stable name: its positions are app transactions of the target's
            tables named after it and the source table, so a restarted link resumes.
        source: the declared stream read (`read`).
        target: the declared stream written (`write`), with the source's partition count.
        poll_interval_s: how long the reader waits when no partition has a new commit.

    Raises:
        ConfigError: a stream is not declared, or the partition counts differ.
    """

    def __init__(
        self, bus: Bus, name: str, *, source: str, target: str, poll_interval_s: float = 0.1
    ) -> None:
        self.bus = bus
        self.name = name
        self.source: Stream = bus.stream(source)
        self.target: Stream = bus.stream(target)
        if self.source.partitions != self.target.partitions:
            raise ConfigError(
                f"link {name}: {source} has {self.source.partitions} partitions and {target} "
                f"{self.target.partitions}",
                "declare the target with the source's partition count",
            )
        self.poll_interval_s = poll_interval_s
        self.stop = threading.Event()
        self.writers = open_writers(bus.lake, self.target)
        self.appenders = [w.appender for w in self.writers]
        self.checkpointers = [w.checkpointer for w in self.writers]
        self.types = self.writers[0].types
        self.subject: _StreamSubject | None = None
        self.observer: _StreamObserver | None = None

    def marker(self, partition: int) -> str:
        return f"pathway:{self.name}:{self.source.table(partition)}"

    def app_id(self, partition: int) -> str:
        return f"pathway:{self.name}:p{partition}"

    def positions(self) -> dict[int, int]:
        """Per partition: the next source version, as the target records it."""
        return {
            p: appender.transaction_version(self.marker(p)) or 0
            for p, appender in enumerate(self.appenders)
        }

    def read(self) -> pw.Table:
        """The source as StreamBatch rows, from the positions the target holds on."""
        self.subject = _StreamSubject(self, self.positions())
        return pw.io.python.read(
            self.subject,
            schema=StreamBatch,
            autocommit_duration_ms=None,
            name=f"deltabus_{self.source.name}",
        )

    def write(self, table: pw.Table) -> None:
        """Append `table`'s rows (partition, version, rows in the target's columns) to the
        target, with the positions they cover."""
        self.observer = _StreamObserver(self)
        pw.io.python.write(table, self.observer, name=f"deltabus_{self.target.name}")

    @property
    def error(self) -> BaseException | None:
        """What stopped the reader or the writer, if anything did."""
        for part in (self.subject, self.observer):
            if part is not None and part.error is not None:
                return part.error
        return None

    def close(self) -> None:
        """Stop the target's checkpointers."""
        close_writers(self.writers)


class _StreamSubject(pw.io.python.ConnectorSubject):
    """Tails every partition of the link's source from its positions."""

    def __init__(self, link: Link, positions: dict[int, int]) -> None:
        super().__init__(datasource_name=f"deltabus:{link.source.name}")
        self.link = link
        self.next_versions = dict(positions)
        self.error: BaseException | None = None

    def run(self) -> None:
        link = self.link
        stream = link.source
        tails = {}
        for p, version in self.next_versions.items():
            tail = DeltaLogTail(link.bus.lake, stream.table(p), columns=stream.schema.names)
            retry_storage(lambda t=tail, v=version: t.start(v), what=f"read {stream.table(p)}")
            tails[p] = tail
        try:
            while not link.stop.is_set():
                if not self._send(tails):
                    link.stop.wait(link.poll_interval_s)
        except BaseException as exc:
            self.error = exc
            link.stop.set()
            raise

    def _send(self, tails: dict[int, DeltaLogTail]) -> int:
        """Send the next commit of every partition that has one; how many were read
        (commits without rows are read, not sent)."""
        sent = 0
        for p, tail in tails.items():
            version = self.next_versions[p]
            table = self.link.source.table(p)
            commit = retry_storage(lambda t=tail, v=version: t.commit(v), what=f"poll {table}")
            if commit is None:
                continue
            rows = retry_storage(lambda t=tail, c=commit: t.rows(c), what=f"read {table}")
            self.next_versions[p] = version + 1
            sent += 1
            if rows is None:
                continue  # no rows (a table's creation, a compaction): nothing to send
            names = [n for n in self.link.source.schema.names if n in rows.column_names]
            rows = rows.select(names).append_column("diff", rows.column("_diff").cast(pa.int64()))
            self.next(partition=p, version=version, rows=pw.wrap_py_object(rows))
        if sent:
            self.commit()
        return sent


class _StreamObserver(pw.io.python.ConnectorObserver):
    """Commits, per Pathway time and partition, the rows received with their positions."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.pending: dict[int, list[tuple[int, Any]]] = {}
        self.seq = {
            p: (a.transaction_version(link.app_id(p)) or 0) + 1
            for p, a in enumerate(link.appenders)
        }
        self.error: BaseException | None = None
        self.commits = 0

    def on_change(self, key: pw.Pointer, row: dict, time: int, is_addition: bool) -> None:
        if not is_addition:
            return  # a map over appended commits retracts nothing it wrote
        self.pending.setdefault(int(row["partition"]), []).append(
            (int(row["version"]), row["rows"].value)
        )

    def on_time_end(self, time: int) -> None:
        try:
            for p, batches in sorted(self.pending.items()):
                self._commit(p, batches)
        except BaseException as exc:
            self.error = exc
            self.link.stop.set()
            raise
        finally:
            self.pending = {}

    def _commit(self, p: int, batches: list[tuple[int, Any]]) -> None:
        link = self.link
        schema = link.target.schema
        tables = []
        for _, rows in batches:
            if rows is not None and rows.num_rows:
                try:
                    tables.append(rows.select(schema.names).cast(schema).cast(link.types))
                except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                    raise ConfigError(
                        f"link {link.name}: rows for {link.target.name} do not fit its "
                        f"schema: {exc}",
                        f"map each batch to the columns {', '.join(schema.names)}",
                    ) from None
        if not tables:
            return  # nothing to write: the position moves with the next rows
        next_version = max(v for v, _ in batches) + 1
        data = pa.concat_tables(tables)
        link.appenders[p].append_once(
            data,
            app_id=link.app_id(p),
            seq=self.seq[p],
            custom_metadata=metadata(**{"pathway.link": link.name}),
            what=f"commit to {link.target.table(p)}",
            checkpointer=link.checkpointers[p],
            markers={link.marker(p): next_version},
        )
        self.seq[p] += 1
        self.commits += 1

    def on_end(self) -> None:
        self.on_time_end(0)
