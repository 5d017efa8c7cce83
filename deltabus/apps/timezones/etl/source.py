"""The ETL's input: deltabus' Pathway table tail (deltabus.connectors.pathway) over one
input table, validating what it reads.

Every Delta version becomes ONE Pathway row holding its accepted rows as an Arrow table
(date, message, diff; `BatchSchema`), which the transform converts in one vectorised
pass. Neither Python nor the engine touches a single message. A version's insertions and
retractions (rows an input deleted or updated, diff -1) travel in that one row, so they
reach the unified table in the same commit. A version the tail refuses stops the ETL
with its position before it (`TableTail`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pathway as pw
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

import deltabus
from deltabus.apps.timezones.contracts import FINISHED_MARK
from deltabus.apps.timezones.etl.rejects import RejectsWriter
from deltabus.apps.timezones.etl.validate import producer_rows, split_rows, split_valid
from deltabus.bus.tail import Commit, DeltaLogTail
from deltabus.connectors.pathway import TableTail
from deltabus.core.errors import DeltabusError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake
from deltabus.delta.table_files import concat, without_views
from deltabus.delta.tables import meta

log = logging.getLogger(__name__)


# Plain Arrow string columns (not string views): cheaper to pickle and to cast.
ARROW_COMPAT = pl.CompatLevel.oldest()


class BatchSchema(pw.Schema):
    """One Delta version of one input table: its accepted rows as one Pathway row.

    `rows` wraps an Arrow table of `date` (canonical, etl.dates), `message` and
    `diff` (+1 insert, -1 retraction). The engine charges per row, so a version costs it
    one row, and Arrow pickles faster than Polars on its way in
    (docs/adr/0010-one-pathway-row-per-input-version.md).
    """

    rows: pw.PyObjectWrapper
    source: str
    version: int


@dataclass
class SourceStats:
    rows: int = 0
    rejected: int = 0
    versions: int = 0
    latest_version: int = -1
    finished_runs: set[str] = field(default_factory=set)
    retractions: int = 0  # rows sent with diff -1 (deleted or updated in the input)
    skipped_change_commits: int = 0  # DELTABUS_SKIP_CHANGE_COMMITS
    skipped_files: int = 0  # unreadable data files left out (--on-corrupt-file skip)


class DeltaTailSubject(TableTail):
    """Tails one input table from `start_version` on: each version's valid rows as one
    `BatchSchema` row, its rejects to `rejects`.

    Bounded, it ends once the producer runs it waits for marked themselves finished
    (`until_runs`, else `expected_producers` of them) and no commit is waiting.
    """

    def __init__(
        self,
        lake: Lake,
        table: str,
        start_version: int,
        *,
        bounded: bool,
        expected_producers: int,
        poll_interval: float,
        stop: threading.Event,
        rejects: RejectsWriter,
        max_versions_per_read: int = 50,
        on_start: Callable[[], None] | None = None,
        finished_runs: set[str] | None = None,
        skip_change_commits: bool = False,
        until_runs: frozenset[str] = frozenset(),
        skip_corrupt_files: bool = False,
    ) -> None:
        super().__init__(
            lake,
            table,
            start_version,
            poll_interval=poll_interval,
            stop=stop,
            max_versions_per_read=max_versions_per_read,
            on_start=on_start,
            skip_change_commits=skip_change_commits,
            skip_corrupt_files=skip_corrupt_files,
        )
        self.bounded = bounded
        self.expected_producers = expected_producers
        # Bounded mode: the producer runs whose finish markers end this input (when set,
        # instead of a count: earlier runs' markers in the table's history do not count).
        self.until_runs = until_runs
        self.rejects = rejects
        self.stats = SourceStats(finished_runs=set(finished_runs or ()))
        # Called right after rows were sent (etl.ticker commits them); with it
        # set, the subject also commits right before sending (see `emit`).
        self.on_sent: Callable[[], None] | None = None
        # The last input version sent to Pathway: the ticker commits until the sink has
        # seen it.
        self.sent_version = start_version - 1

    def resumed(self) -> None:
        if not self.bounded:
            return
        if self.next_version > 0:
            self._note_finished_before(self.next_version)
        # The runs whose last commit landed, from the marks in the table's app
        # transactions, which log cleanup never removes (commit metadata it does).
        marks = deltabus.recorded_marks(self.lake, self.table, FINISHED_MARK)
        self.stats.finished_runs.update(run for run, value in marks.items() if value)

    def finished(self) -> bool:
        if not self.bounded:
            return False
        if self.until_runs:
            return self.until_runs <= self.stats.finished_runs
        return len(self.stats.finished_runs) >= self.expected_producers

    def _note_finished_before(self, version: int) -> None:
        """Finish markers in versions an earlier run already processed still count."""
        try:
            history = retry_storage(
                lambda: self.lake.open(self.table).history(), what=f"history of {self.table}"
            )
        except DeltabusError:
            raise
        except Exception as exc:  # noqa: BLE001 - delta-rs cannot open it; the tail decides
            log.warning(
                "cannot read the history of %s (%s); finished producer runs before version "
                "%d come from timezone_unified's record only",
                self.table,
                str(exc).splitlines()[0][:200],
                version,
            )
            return
        for info in history:
            if info.get("version", -1) < version:
                self._note_finished(info)

    def _validate(self, batch: pa.Table) -> pa.Table:
        """The batch's valid rows (`date`, `message`, `_commit_version`, `_diff`, in
        version order); rejects of rows the input gained go to `rejects`.

        A producer's appends are checked and kept in Arrow (`producer_rows`). A
        retraction (diff -1) that is not valid takes back a row that was rejected when
        it was inserted (validation is the same both times: a schema change that alters
        how rows read re-reads them, deltabus.bus.tail), so it has nothing to retract and is
        not rejected a second time.
        """
        diff = batch.column("_diff")
        if batch.num_rows and (pc.min(diff).as_py() or 0) < 0:
            batch = without_views(batch)
            inserted = batch.filter(pc.greater(diff, 0))
            retracted = batch.filter(pc.less(diff, 0))
            valid, bad = split_valid(inserted)
            if retracted.num_rows:
                valid_retracted, bad_retracted = split_valid(retracted)
                # Versions go out in order: positions advance with the highest one sent.
                valid = pl.concat([valid, valid_retracted]).sort(
                    "_commit_version", maintain_order=True
                )
                if bad_retracted.height:
                    log.info(
                        "%s: %d retraction(s) of rows rejected when inserted dropped",
                        self.table,
                        bad_retracted.height,
                    )
        else:
            fast = producer_rows(batch)
            if fast is not None:
                return fast
            valid, bad = split_rows(batch)
        if bad.height:
            self.stats.rejected += bad.height
            self.rejects.write(self.table, bad)
        return valid.to_arrow(compat_level=ARROW_COMPAT)

    def emit(self, tail: DeltaLogTail, commits: list[Commit]) -> None:
        """Validate the commits' rows and send one Pathway row per version; a version
        whose rows the tail refuses raises before any of the commits is sent."""
        parts = [
            rows
            for c in commits
            if (rows := retry_storage(lambda c=c: tail.rows(c), what=f"read {self.table}"))
        ]
        for commit in commits:
            self._note_finished(commit.info)
        self.stats.skipped_change_commits = tail.skipped_change_commits
        self.stats.skipped_files = tail.skipped_files
        groups: list[tuple[int, pa.Table]] = []
        if parts:
            valid = self._validate(concat(parts))
            self.stats.rows += valid.num_rows
            self.stats.retractions += int(pc.sum(pc.less(valid["_diff"], 0)).as_py() or 0)
            groups = list(by_version(valid))
        last = commits[-1].version
        if not groups or groups[-1][0] < last:
            # The last versions carry no valid rows (a producer's closing commit to a
            # partition it gave no rows, rows all rejected): an empty batch still takes the
            # sink's position past them, and its finished runs with it.
            groups.append((last, EMPTY_ROWS))
        if self.on_sent is not None:
            # Rows take the Pathway time opened by their input's last commit: commit
            # first, so `time` is now and not when the previous rows were sent.
            self.commit()
        self.sent_version = last
        for version, rows in groups:
            self.next(rows=pw.wrap_py_object(rows), source=self.table, version=version)
        if self.on_sent is not None:
            self.on_sent()
        self.stats.versions += len(commits)
        self.stats.latest_version = commits[-1].version

    def _note_finished(self, info: dict) -> None:
        """Bounded mode: remember which producer runs marked themselves finished."""
        if meta(info, "producer.finished"):
            self.stats.finished_runs.add(str(meta(info, "producer.run_id")))


# A version batch with no rows (`BatchSchema.rows` columns).
EMPTY_ROWS = pa.table(
    {
        "date": pa.array([], pa.string()),
        "message": pa.array([], pa.string()),
        "diff": pa.array([], pa.int64()),
    }
)


def by_version(valid: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """(version, its rows as `BatchSchema.rows` holds them) for each version in `valid`,
    whose rows are in version order.

    Several versions are copied apart (`take`), not sliced: a pickled slice of an Arrow
    table carries its parent's whole buffers, so slices would send a backlog's rows once
    per version.
    """
    versions = valid.column("_commit_version").to_numpy()
    rows = valid.select(["date", "message", "_diff"]).rename_columns(["date", "message", "diff"])
    starts = [0, *(np.flatnonzero(np.diff(versions)) + 1).tolist(), len(versions)]
    if len(starts) == 2:
        if len(versions):
            yield int(versions[0]), rows
        return
    for lo, hi in itertools.pairwise(starts):
        yield int(versions[lo]), rows.take(np.arange(lo, hi))
