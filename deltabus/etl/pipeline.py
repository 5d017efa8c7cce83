"""The Pathway program: tail both input tables, parse `date`, write the unified table.

Run it in its own process (`deltabus etl`); it never runs inside Dagster's process.
On start it resumes from the input positions recorded in the unified table's log, so a
killed ETL restarted with the same lake produces every message exactly once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pathway as pw
from deltalake import DeltaTable

from deltabus.checkpoints import BackgroundCheckpointer
from deltabus.errors import ConfigError
from deltabus.etl.rejects import RejectsWriter
from deltabus.etl.sink import ETL_APP_ID, DeltaSinkObserver, position_marker
from deltabus.etl.source import BatchSchema, DeltaTailSubject
from deltabus.gctune import tune_gc_for_streaming
from deltabus.lake import INPUT_TABLES, UNIFIED_TABLE, Lake
from deltabus.retry import retry_storage
from deltabus.tables import UNIFIED_SCHEMA, ensure_table, find_commit, meta

log = logging.getLogger(__name__)

DATE_FORMAT = "%Y-%m-%d %H:%M:%S.%f %z"


@dataclass(frozen=True)
class EtlConfig:
    bounded: bool = True
    commit_interval: float = 0.1
    poll_interval: float = 0.02
    expected_producers: int = 1
    autocommit_ms: int = 10
    threads: int = 1

    def __post_init__(self) -> None:
        if not 0.001 <= self.commit_interval <= 60:
            raise ConfigError(f"commit interval must be 0.001..60 s, got {self.commit_interval}")
        if not 0.001 <= self.poll_interval <= 60:
            raise ConfigError(f"poll interval must be 0.001..60 s, got {self.poll_interval}")
        if not 1 <= self.threads <= 64:
            raise ConfigError(f"threads must be 1..64, got {self.threads}")
        if self.expected_producers < 1:
            raise ConfigError("expected producers must be at least 1")


@dataclass
class EtlReport:
    rows: int
    rejected: int
    commits: int
    unified_version: int
    elapsed_s: float
    throughput_rows_s: float
    positions: dict[str, int]
    resumed_from: dict[str, int]

    def as_dict(self) -> dict:
        return asdict(self)


def recorded_positions(dt: DeltaTable) -> tuple[dict[str, int], int]:
    """Input positions and next sink sequence from the unified table's log."""
    seq = dt.transaction_version(ETL_APP_ID)
    if seq is None:
        return dict.fromkeys(INPUT_TABLES, -1), 0
    positions = {t: dt.transaction_version(position_marker(t)) for t in INPUT_TABLES}
    if any(v is None for v in positions.values()):
        # Tables written before positions were app transactions: the commit metadata.
        info = find_commit(dt, lambda c: meta(c, "etl.positions") is not None, limit=1000)
        recorded = meta(info, "etl.positions") if info else {}
        for table, value in positions.items():
            if value is None:
                positions[table] = int(recorded.get(table, -1))
    return {t: int(v) for t, v in positions.items()}, seq + 1


def recorded_finished_runs(dt: DeltaTable) -> dict[str, set[str]]:
    """Producer runs the ETL already saw finish, per input table, from its newest commit.

    Bounded mode stops once the expected producers have finished. Their finish markers
    may sit in input log files that have expired by the time an ETL restarts, so every
    unified commit also carries the finished runs seen so far.
    """
    info = find_commit(dt, lambda c: meta(c, "etl.finished_runs") is not None, limit=50)
    recorded = meta(info, "etl.finished_runs") if info else {}
    return {table: set(runs) for table, runs in (recorded or {}).items()}


def unified_expression(batches: pw.Table) -> pw.Table:
    """Flatten version batches into rows and parse `date` into epoch milliseconds (UTC).

    `diff` is the input row's sign: -1 for a row an input lost (delete, update pre-image),
    which the sink writes as a retraction.
    """
    rows = batches.flatten(pw.this.rows)
    return rows.select(
        timestamp=pw.this.rows[0].dt.strptime(DATE_FORMAT).dt.timestamp(unit="ms"),
        message=pw.this.rows[1],
        diff=pw.this.rows[2],
        source=pw.this.source,
        version=pw.this.version,
    )


def run_etl(
    lake: Lake,
    config: EtlConfig,
    stop: threading.Event | None = None,
    ready_file: Path | None = None,
) -> EtlReport:
    """Run the ETL until both inputs finish (bounded) or until `stop` / SIGTERM (continuous).

    `ready_file` is created once the dataflow runs, so a launcher can wait for it.
    """
    stop = stop or threading.Event()
    lake.require_delta_or_absent(UNIFIED_TABLE)  # inputs are checked while waiting for them

    def mark_ready() -> None:
        if ready_file is not None:
            Path(ready_file).touch()

    unified = retry_storage(
        lambda: ensure_table(lake, UNIFIED_TABLE, UNIFIED_SCHEMA), what="open timezone_unified"
    )
    positions, seq = retry_storage(lambda: recorded_positions(unified), what="read ETL positions")
    finished = retry_storage(
        lambda: recorded_finished_runs(unified), what="read finished producer runs"
    )
    log.info(
        "ETL (%s) on %s: resuming after input versions %s",
        "bounded" if config.bounded else "continuous",
        lake.settings.describe(),
        positions,
    )
    rejects = RejectsWriter(lake)
    subjects = [
        DeltaTailSubject(
            lake,
            table,
            positions[table] + 1,
            bounded=config.bounded,
            expected_producers=config.expected_producers,
            poll_interval=config.poll_interval,
            stop=stop,
            rejects=rejects,
            on_start=mark_ready,
            finished_runs=finished.get(table, set()),
        )
        for table in INPUT_TABLES
    ]
    streams = [
        pw.io.python.read(
            subject,
            schema=BatchSchema,
            autocommit_duration_ms=config.autocommit_ms,
            name=f"delta_{subject.table}",
        )
        for subject in subjects
    ]
    unified_rows = unified_expression(pw.Table.concat_reindex(*streams))
    checkpointer = BackgroundCheckpointer(lake, UNIFIED_TABLE)
    sink = DeltaSinkObserver(
        unified,
        positions,
        config.commit_interval,
        seq,
        checkpointer,
        finished_runs=lambda: {s.table: sorted(s.stats.finished_runs) for s in subjects},
    )
    pw.io.python.write(unified_rows, sink, name="delta_timezone_unified")

    def request_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    os.environ["PATHWAY_THREADS"] = str(config.threads)
    tune_gc_for_streaming()
    started = time.monotonic()
    try:
        pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    elapsed = time.monotonic() - started
    return EtlReport(
        rows=sink.stats.rows,
        rejected=sum(s.stats.rejected for s in subjects),
        commits=sink.stats.commits,
        unified_version=sink.stats.version,
        elapsed_s=round(elapsed, 3),
        throughput_rows_s=round(sink.stats.rows / elapsed, 1) if elapsed else 0.0,
        positions=sink.positions,
        resumed_from=positions,
    )
