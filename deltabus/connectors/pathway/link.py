"""Pathway on deltabus streams, with no licence key: a stream read as one Pathway row per
partition commit, and such rows written to another stream, exactly once.

    link = Link(bus, "eur", source="orders", target="orders_eur")
    batches = link.read()                      # partition, version, rows (Arrow)
    link.write(batches.select(partition=pw.this.partition, version=pw.this.version,
                              rows=to_eur(pw.this.rows)))
    pw.run()

Each row's `rows` wraps an Arrow table: the source's columns and `diff` (+1, or -1 for a
row another writer deleted or updated). A Pathway program maps it to the target's
columns (a `pw.udf` over the wrapped table). Each partition is read by a `TableTail`
and written by a `TableSink`, the time-zone ETL's own source and sink: about once per
commit interval the sink commits the rows it got, together with the last source version
they cover, in one Delta commit of the target's partition table; the reader of a
restarted program starts after those positions. So every source commit reaches the
target exactly once, whenever the program dies, as long as each output row comes from
one input row (a map, a filter): positions travel in the rows. A link claims the
target's tables when it starts (deltabus.bus.fence): an older program of the same link
still running stops at its next commit. Like the time-zone ETL,
this costs the engine one row per commit, not per record
(docs/adr/0010-one-pathway-row-per-input-version.md).

A program may run some of the partitions (`partitions`). Replicas of a link share them
by leases in the lake when each runs under `deltabus link --lease` (the
deltabus.adapters.link_lease supervisor), which gives the program the partitions it
holds in `LINK_ENV` and `PARTITIONS_ENV` and restarts it when they change.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import pathway as pw
import pyarrow as pa

from deltabus.bus.client import Bus
from deltabus.bus.positions import position_marker
from deltabus.bus.streams import Stream
from deltabus.bus.tail import Commit, DeltaLogTail
from deltabus.connectors.pathway.output import Output, open_output
from deltabus.connectors.pathway.sink import Received, TableSink
from deltabus.connectors.pathway.tail import TableTail
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage

log = logging.getLogger(__name__)

LINK_ENV = "DELTABUS_LINK"  # the link a `deltabus link --lease` replica runs
PARTITIONS_ENV = "DELTABUS_LINK_PARTITIONS"  # the partitions it holds: "0,2"


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
            tables named after it, the partition and the source table
            (`position_marker`), so a restarted link resumes.
        source: the declared stream read (`read`).
        target: the declared stream written (`write`), with the source's partition count.
        poll_interval_s: how long a partition's reader waits after finding no new commit.
        commit_interval_s: the writer commits each partition about once per interval.
        partitions: the partitions this program reads and writes. None: the ones
            `PARTITIONS_ENV` lists when `LINK_ENV` names this link (a replica of
            `deltabus link --lease` sets both), else all.

    Raises:
        ConfigError: a stream is not declared, the partition counts differ, or a
            partition is out of range.
    """

    def __init__(
        self,
        bus: Bus,
        name: str,
        *,
        source: str,
        target: str,
        poll_interval_s: float = 0.1,
        commit_interval_s: float = 0.1,
        partitions: Sequence[int] | None = None,
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
        self.partitions = self._partitions(partitions)
        self.poll_interval_s = poll_interval_s
        self.commit_interval_s = commit_interval_s
        self.stop = threading.Event()
        self._outputs: dict[int, Output] = {}
        self.tails: list[_PartitionTail] = []
        self.sinks: list[TableSink] = []

    def _partitions(self, given: Sequence[int] | None) -> list[int]:
        count = self.target.partitions
        source = "partitions"
        if given is None and os.environ.get(LINK_ENV) == self.name:
            text = os.environ.get(PARTITIONS_ENV, "")
            source = f"{PARTITIONS_ENV} ({text!r})"
            try:
                given = [int(part) for part in text.split(",") if part.strip()]
            except ValueError:
                given = []
            if not given:
                raise ConfigError(
                    f"link {self.name}: {source} is not a list of partition indices",
                    f"leave {LINK_ENV} and {PARTITIONS_ENV} to `deltabus link --lease`",
                )
        chosen = sorted(set(range(count) if given is None else given))
        if not chosen or not all(0 <= p < count for p in chosen):
            raise ConfigError(
                f"link {self.name}: {source} {chosen} are not partitions of "
                f"{self.target.name} (0..{count - 1})",
                f"give partition indices from 0 to {count - 1}",
            )
        return chosen

    def app_id(self, partition: int) -> str:
        return f"pathway:{self.name}:p{partition}"

    def outputs(self) -> dict[int, Output]:
        """This program's partition tables of the target, by partition, opened and
        claimed on the first call (an older program of this link stops at its next
        commit)."""
        if not self._outputs:
            target = self.target
            self._outputs = {
                p: open_output(
                    self.bus.lake,
                    target.table(p),
                    target.schema,
                    app_id=self.app_id(p),
                    inputs=[self.source.table(p)],
                    writer=f"Pathway link {self.name}",
                    properties=target.settings.properties(),
                    checkpoint_interval=target.settings.checkpoint_interval,
                )
                for p in self.partitions
            }
        return self._outputs

    def positions(self) -> dict[int, int]:
        """Per partition of this program: the last source version in the target (-1:
        none)."""
        positions = {}
        for p, output in self.outputs().items():
            marker = position_marker(self.app_id(p), self.source.table(p))
            last = output.appender.transaction_version(marker)
            positions[p] = -1 if last is None else last
        return positions

    def read(self) -> pw.Table:
        """The source as StreamBatch rows, from the positions the target holds on."""
        self.tails = [_PartitionTail(self, p, v + 1) for p, v in self.positions().items()]
        tables = [
            pw.io.python.read(
                tail, schema=StreamBatch, autocommit_duration_ms=None, name=f"deltabus_{tail.table}"
            )
            for tail in self.tails
        ]
        return pw.Table.concat_reindex(*tables) if len(tables) > 1 else tables[0]

    def write(self, table: pw.Table) -> None:
        """Append `table`'s rows (partition, version, rows in the target's columns) to the
        target's partitions, each commit with the source positions it covers
        (deltabus.connectors.pathway.sink). A failed commit, rows that do not fit the
        target, or a newer program of this link stop the reader: `pw.run()` returns and
        `close()` raises the error."""
        for p, output in self.outputs().items():
            sink = TableSink(
                output,
                self.commit_interval_s,
                to_table=lambda batches, types=output.types: self._target_rows(batches, types),
                commit_info=lambda: {"pathway.link": self.name},
                on_failure=lambda _exc: self.stop.set(),
            )
            batches = table.filter(pw.this.partition == p).select(
                rows=pw.this.rows, source=self.source.table(p), version=pw.this.version
            )
            pw.io.python.write(batches, sink, name=f"deltabus_{output.table}")
            self.sinks.append(sink)

    def _target_rows(self, batches: list[Received], types: pa.Schema) -> pa.Table:
        """The batches' rows in the target's columns and types; a batch Pathway retracts
        is left out (a map over appended commits retracts nothing it wrote)."""
        schema = self.target.schema
        tables = []
        for rows, _, sign in batches:
            if sign < 0:
                continue
            try:
                tables.append(rows.select(schema.names).cast(schema).cast(types))
            except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise ConfigError(
                    f"link {self.name}: rows for {self.target.name} do not fit its schema: {exc}",
                    f"map each batch to the columns {', '.join(schema.names)}",
                ) from None
        return pa.concat_tables(tables) if tables else types.empty_table()

    @property
    def error(self) -> BaseException | None:
        """What stopped the reader or the writer, if anything did."""
        for part in (*self.tails, *self.sinks):
            if part.error is not None:
                return part.error
        return None

    def close(self) -> None:
        """Stop the target's checkpointers (the sinks stop theirs at the program's end).

        Raises:
            DeltabusError: what stopped the link, if anything did (`FencedError`: a newer
                program of this link took over; a `ConfigError`: rows that did not fit).
        """
        for output in self._outputs.values():
            output.close()
        if self.error is not None:
            raise self.error


class _PartitionTail(TableTail):
    """Tails one partition of the link's source: each commit with rows as one
    `StreamBatch` row."""

    def __init__(self, link: Link, partition: int, start_version: int) -> None:
        stream = link.source
        super().__init__(
            link.bus.lake,
            stream.table(partition),
            start_version,
            poll_interval=link.poll_interval_s,
            stop=link.stop,
            columns=stream.schema.names,
        )
        self.link = link
        self.partition = partition

    def emit(self, tail: DeltaLogTail, commits: list[Commit]) -> None:
        names = self.link.source.schema.names
        batches = []
        for commit in commits:
            rows = retry_storage(lambda c=commit: tail.rows(c), what=f"read {self.table}")
            if rows is not None:  # None: no rows (a table's creation, a compaction)
                batches.append((commit.version, rows))
        for version, rows in batches:
            diff = rows.column("_diff").cast(pa.int64())
            rows = rows.select([n for n in names if n in rows.column_names])
            rows = rows.append_column("diff", diff)
            self.next(partition=self.partition, version=version, rows=pw.wrap_py_object(rows))
        self.commit()
