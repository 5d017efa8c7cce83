"""Checkpoints written beside the commit path, never on it.

delta-rs checkpoints a table in the commit that reaches every `delta.checkpointInterval`
(100) versions, and deletes expired log files in the same call, so that commit takes
longer than the others and a streaming writer's next batches queue behind it
(docs/adr/0013-checkpoints-from-memory.md).

A writer that owns a `BackgroundCheckpointer` commits without those post-commit hooks
and reports each committed version; a thread of its own loads the table at the due
version, writes the checkpoint, expires old log files and loads a fresh handle from the
new checkpoint, which the writer swaps in before its next commit (`refreshed`). delta-rs
releases the GIL for all of it, so the writer's commits and Python threads go on
meanwhile. A failed checkpoint costs only speed (readers replay more log): it is logged
and tried again at the next interval.

A writer that reports each version with the actions it committed or read (the fast
append path, deltabus.delta.append) gets its checkpoints from a `CheckpointWriter`
instead, which keeps the table state in memory and writes a checkpoint in two PUTs
with no reads (deltabus.delta.checkpoint_writer). delta-rs remains the fallback: for versions
reported without actions, for tables that writer does not handle, and after any error.
"""

from __future__ import annotations

import logging
import threading
import zlib

from deltalake import DeltaTable, PostCommitHookProperties

from deltabus.delta.checkpoint_writer import (
    Actions,
    CheckpointWriter,
    Unsupported,
    create_checkpoint_once,
)
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

# What writers pass to delta-rs when checkpoints are written in the background.
NO_POST_COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


class BackgroundCheckpointer:
    """Checkpoints one table every `interval` versions on a daemon thread.

    The interval is `DELTABUS_CHECKPOINT_INTERVAL` (100, Delta's default); off the
    commit path its length does not set latency, and longer means less background work
    (docs/adr/0013-checkpoints-from-memory.md).
    """

    def __init__(self, lake: Lake, table: str, interval: int | None = None) -> None:
        self.lake = lake
        self.table = table
        self.interval = interval or lake.settings.checkpoint_interval
        # Tables written in lockstep (the two inputs, the output) would all checkpoint
        # in the same instant; a per-table offset spreads that work out.
        self.offset = zlib.crc32(table.encode()) % self.interval
        self.written: list[int] = []  # versions checkpointed, for reports and tests
        self.from_memory: list[int] = []  # those of them the CheckpointWriter wrote
        self.failures = 0
        self.writer = CheckpointWriter(lake, table)
        self._from_memory = True  # False once the writer met a table it does not handle
        self._last_due = -1  # highest multiple of `interval` already handled
        self._target = -1  # latest committed version that crossed a multiple
        self._cond = threading.Condition()
        self._closing = False
        self._fresh: DeltaTable | None = None  # loaded after the latest checkpoint
        self._wants_fresh = False  # set once the writer asks for fresh handles
        self._dt: DeltaTable | None = None  # this thread's handle, advanced per checkpoint
        self._thread = threading.Thread(target=self._loop, name=f"checkpoint-{table}", daemon=True)
        self._thread.start()

    def committed(self, version: int, actions: Actions | None = None) -> None:
        """`version` was committed: checkpoint when it reaches the next interval.

        `actions` are the version's actions (parse_actions' grouping), from a writer that
        has them without reading (the fast append path): while versions come with them,
        checkpoints are written from memory. While they come without (a writer on
        delta-rs' commit path), delta-rs writes them; the in-memory state is reloaded
        from storage once actions come again.
        """
        if self._from_memory:
            self.writer.feed(version, actions)
        due = (version + self.offset) // self.interval
        with self._cond:
            if due > self._last_due and version > self._target:
                self._target = version
                self._cond.notify()

    def close(self, timeout: float = 30.0) -> None:
        """Finish a checkpoint that is due, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._target < 0 and not self._closing:
                    self._cond.wait()
                target, self._target = self._target, -1
                closing = self._closing
                if target >= 0:  # later commits of this interval wait for the next one
                    self._last_due = max(self._last_due, (target + self.offset) // self.interval)
            if target >= 0:
                self._checkpoint(target)
            if closing:
                return

    def _checkpoint(self, target: int) -> None:
        if self._from_memory and self.writer.follows and self._write_from_memory(target):
            return
        try:
            if self._dt is None:
                self._dt = self.lake.open(self.table, version=target)
            else:  # reads only the commits since the last checkpoint: one GET each
                self._dt.load_as_version(target)
            create_checkpoint_once(self.lake, self.table, self._dt)
            self._dt.cleanup_metadata()
            # A writer on delta-rs' commit path swaps in a handle that starts from the
            # checkpoint just written (`refreshed`); one that appends on its own does not.
            fresh = self.lake.open(self.table) if self._wants_fresh else None
        except Exception as exc:  # noqa: BLE001 - a missed checkpoint only costs speed
            self.failures += 1
            self._dt = None  # load it whole at the next interval
            log.warning(
                "checkpoint of %s at version %d failed (retried at the next interval): %s",
                self.table,
                target,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            return
        with self._cond:
            self._fresh = fresh
        self.written.append(target)
        log.debug("checkpointed %s at version %d", self.table, target)

    def _write_from_memory(self, target: int) -> bool:
        """Checkpoint `target` with the CheckpointWriter; False when delta-rs must."""
        try:
            written = self.writer.write(target)
        except Unsupported as exc:
            self._from_memory = False
            self.writer.reset()
            log.info("%s is checkpointed by delta-rs from now on: %s", self.table, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - delta-rs writes this one instead
            self.writer.reset()
            log.warning(
                "checkpoint of %s at version %d from memory failed, delta-rs writes it: %s",
                self.table,
                target,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            return False
        self.written.append(target)
        if not written.kept:
            self.from_memory.append(target)
        log.debug(
            "checkpointed %s at version %d from memory (%d actions, %d bytes%s%s)",
            self.table,
            target,
            written.actions,
            written.size,
            ", state reloaded" if written.seeded else "",
            f", {written.cleaned} expired log files deleted" if written.cleaned else "",
        )
        return True

    def refreshed(self, dt: DeltaTable) -> DeltaTable:
        """The handle the writer should commit with: a fresh one after a checkpoint.

        A delta-rs table handle keeps every commit since the checkpoint it was loaded
        from and works through all of them on each commit, so a writer that never
        reloads gets slower with every version (docs/adr/0013-checkpoints-from-memory.md).
        The handle loaded after the latest checkpoint, brought up to date (a few
        versions), replaces it.
        """
        with self._cond:
            fresh, self._fresh = self._fresh, None
            self._wants_fresh = True
        if fresh is None:
            return dt
        try:
            fresh.update_incremental()
        except Exception as exc:  # noqa: BLE001 - keep the old handle, it still works
            log.warning("could not refresh the %s handle: %s", self.table, exc)
            return dt
        return fresh if fresh.version() >= dt.version() else dt
