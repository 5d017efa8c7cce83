"""Exactly-once consume-transform-produce between streams of equal partition counts.

Partition i of the output is written from partition i of every input, by one process.
Each output commit carries, as app transactions of the output table, the next version of
every input table it covers (`transform:<name>:<input table>`), so the rows and the
positions land together or not at all. A transform restarted after a crash reads those
positions back from the output table and goes on after them: every input commit is
transformed into the output exactly once, however often the process dies. The Pathway
ETL of the time-zone pipeline keeps its positions the same way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from deltabus.bus.streams import Stream
from deltabus.bus.tail import DeltaLogTail
from deltabus.bus.writers import open_writer
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.tables import metadata

log = logging.getLogger(__name__)

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")


@dataclass(frozen=True)
class Source:
    """Where a batch handed to the transform function comes from."""

    stream: str
    partition: int
    version: int


# rows: the input's columns and `diff` (+1 or -1); returns rows of the output's schema.
TransformFn = Callable[[pa.Table, Source], pa.Table | None]


class Transform:
    """Runs `fn` over one partition of the inputs into the same partition of `output`.

    Args:
        lake: the lake.
        name: the transform's stable name; its positions are kept under it.
        inputs: the streams read; each has the output's partition count.
        output: the stream written.
        partition: the partition this process runs.
        fn: called once per input commit with rows; what it returns is appended.

    `fn` must be a function of its arguments: an input commit whose output was not
    committed when the process died is transformed again. One process at a time may run
    a (name, partition); a second one is not fenced.
    """

    def __init__(
        self,
        lake: Lake,
        name: str,
        inputs: list[Stream],
        output: Stream,
        partition: int,
        fn: TransformFn,
    ) -> None:
        if not name or not set(name) <= NAME_CHARS:
            raise ConfigError(
                f"transform name {name!r} is not usable",
                "use lower-case letters, digits, '_', '-' and '.'",
            )
        wrong = [s.name for s in inputs if s.partitions != output.partitions]
        if wrong or not inputs:
            raise ConfigError(
                f"transform {name}: inputs {', '.join(wrong) or '(none)'} do not have the "
                f"{output.partitions} partitions of {output.name}",
                "declare the output with the inputs' partition count",
            )
        if not 0 <= partition < output.partitions:
            raise ConfigError(f"partition must be 0..{output.partitions - 1}, got {partition}")
        self.lake = lake
        self.name = name
        self.output = output
        self.partition = partition
        self.fn = fn
        self.table = output.table(partition)
        writer = open_writer(lake, output, partition)
        self.appender = writer.appender
        self.types = writer.types
        self.checkpointer = writer.checkpointer
        self.app_id = f"transform:{name}:p{partition}"
        self.seq = (self.appender.transaction_version(self.app_id) or 0) + 1
        self.tails: dict[str, tuple[Stream, DeltaLogTail]] = {}
        self.positions: dict[str, int] = {}  # input table -> next version to read
        for stream in inputs:
            table = stream.table(partition)
            tail = DeltaLogTail(lake, table, columns=stream.schema.names)
            position = self.appender.transaction_version(self._marker(table)) or 0
            retry_storage(lambda t=tail, p=position: t.start(p), what=f"read {table}'s state")
            self.tails[table] = (stream, tail)
            self.positions[table] = position
        self.commits = 0

    def _marker(self, table: str) -> str:
        return f"transform:{self.name}:{table}"

    def step(self) -> int:
        """Transform every input commit that has landed, as one output commit; returns
        how many input commits it covered (0: nothing new)."""
        outputs: list[pa.Table] = []
        positions = dict(self.positions)
        for table, (stream, tail) in self.tails.items():
            while True:
                version = positions[table]
                commit = retry_storage(lambda t=tail, v=version: t.commit(v), what=f"poll {table}")
                if commit is None:
                    break
                rows = retry_storage(lambda t=tail, c=commit: t.rows(c), what=f"read {table}")
                positions[table] = version + 1
                if rows is None:
                    continue
                names = [n for n in stream.schema.names if n in rows.column_names]
                data = rows.select(names).append_column(
                    "diff", rows.column("_diff").cast(pa.int64())
                )
                out = self.fn(data, Source(stream.name, self.partition, version))
                if out is not None and out.num_rows:
                    outputs.append(self._fit(out))
        covered = sum(positions[t] - self.positions[t] for t in positions)
        if not covered:
            return 0
        if outputs:
            rows = pa.concat_tables(outputs)
            self.appender.append_once(
                rows,
                app_id=self.app_id,
                seq=self.seq,
                custom_metadata=metadata(**{"transform.name": self.name}),
                what=f"commit to {self.table}",
                checkpointer=self.checkpointer,
                markers={self._marker(t): v for t, v in positions.items()},
            )
            self.seq += 1
            self.commits += 1
        # Input commits that made no rows are not recorded: after a restart they are
        # transformed again, and again make none.
        self.positions = positions
        return covered

    def _fit(self, out: pa.Table) -> pa.Table:
        schema = self.output.schema
        try:
            return out.select(schema.names).cast(schema).cast(self.types)
        except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ConfigError(
                f"transform {self.name} returned rows that do not fit {self.output.name}: {exc}",
                f"return the columns {', '.join(schema.names)} with the output's types",
            ) from None

    def run(self, stop: threading.Event, poll_interval_s: float = 0.1) -> None:
        """Step until `stop` is set, waiting `poll_interval_s` when nothing is new."""
        try:
            while not stop.is_set():
                if not self.step():
                    stop.wait(poll_interval_s)
        finally:
            self.checkpointer.close()
