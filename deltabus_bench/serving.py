"""`deltabus bench --serve postgres|opensearch`: the serving sink under load, as its own stage.

Per run: the serving store (PostgreSQL: DELTABUS_POSTGRES_DSN, else a throwaway one on
loopback; OpenSearch: deltabus_bench.serving_opensearch), the sink as its own process
(`deltabus serve <backend> --follow`), and a reader in the benchmark process that polls
the store for messages of unified versions it has not seen and stamps when each message
became visible there (PostgreSQL: `WHERE version > last`, on the table's version index).
The stage "unified commit → served" is that moment minus the unified commit the Delta
consumer saw the row in; the serving verdict applies the benchmark's rule
(deltabus_bench.verdict) to sent → served. CPU is measured for the sink and for the
store's server (its process and all its children).
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from deltabus.apps.timezones.latency import PERCENTILES, over_time, percentile_sql
from deltabus.core.processes import ChildProcess, deltabus_command
from deltabus_bench.config import SERVE_SYSTEMS
from deltabus_bench.result_parts import Percentiles, Serving, Verdict

log = logging.getLogger("deltabus_bench")

SERVED_SCHEMA = pa.schema([("message", pa.string()), ("served_ms", pa.float64())])
SYSTEMS = SERVE_SYSTEMS  # per backend, the store's name
SINK_CPU = "serve sink"
REPLAY_TIMEOUT_S = 1800  # --serve-replay: the longest a standalone load may take


class ServedReader(threading.Thread):
    """Polls a serving store for new versions; records when each message showed up.

    A subclass says what one poll found (`poll`) and which failures are worth another
    poll (`is_transient`, after which `reset` drops the connection).
    """

    def __init__(self, poll_s: float) -> None:
        super().__init__(name="served-reader", daemon=True)
        self.poll_s = poll_s
        self.stop_event = threading.Event()
        self.messages: list[list[str]] = []
        self.stamps: list[np.ndarray] = []
        self.seen = 0  # served messages, each counted once (OpenSearch: once acknowledged)
        self.last_progress = time.monotonic()
        self.error: BaseException | None = None

    def poll(self) -> tuple[list[str], int]:
        """The messages visible now that earlier polls may not have seen (some may repeat
        earlier sightings), and how many of them are counted for the first time."""
        raise NotImplementedError

    def is_transient(self, exc: BaseException) -> bool:
        return False

    def reset(self) -> None:
        """Drop the connection after a transient failure (the next poll reconnects)."""

    def finish(self) -> None:
        """Once the run is over and the sink stopped, before the store goes: read what
        `table` needs that polling did not (nothing by default)."""

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    found, counted = self.poll()
                except Exception as exc:
                    if not self.is_transient(exc):
                        raise
                    self.reset()
                    found, counted = [], 0
                if found:
                    self.messages.append(found)
                    self.stamps.append(np.full(len(found), time.time() * 1000))
                if found or counted:
                    self.last_progress = time.monotonic()
                self.seen += counted
                self.stop_event.wait(self.poll_s)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the runner
            log.exception("served reader failed")
            self.error = exc
        finally:
            self.reset()

    def table(self) -> pa.Table:
        """First sighting of every message (message, served_ms)."""
        if not self.messages:
            return SERVED_SCHEMA.empty_table()
        raw = pa.table(
            {
                "message": pa.array([m for part in self.messages for m in part], pa.string()),
                "served_ms": pa.array(np.concatenate(self.stamps), pa.float64()),
            }
        )
        con = duckdb.connect()
        con.register("raw", raw)
        return con.sql(
            "SELECT message, min(served_ms) AS served_ms FROM raw GROUP BY message"
        ).to_arrow_table()


class ServingRun:
    """The serving store, the sink process and the reader for one benchmark run.

    A subclass starts and removes the store (`_start_store`, `_remove_store`), names the
    sink's options and environment, and makes the reader.
    """

    backend: str  # one of SYSTEMS
    rows_key: str  # the sink report's count of served rows (documents for an index)

    def __init__(self, settings: Any, work: Path, tag: str, poll_s: float) -> None:
        self.settings, self.work, self.tag, self.poll_s = settings, work, tag, poll_s
        self.sink: ChildProcess | None = None
        self.reader: ServedReader | None = None
        self.report: dict | None = None
        self.replay_report: dict | None = None
        self.raw_capacity: dict | None = None  # the store's own write rate, measured at start
        self.errors: list[str] = []
        self._command_prefix = ""
        self._env: dict[str, str] = {}

    @property
    def system(self) -> str:
        return SYSTEMS[self.backend]

    def _start_store(self, cpu: Any) -> None:
        """Start a throwaway store when none is configured, its CPU watched by `cpu`."""
        raise NotImplementedError

    @property
    def target(self) -> str:
        """The table or index the run's sink serves into."""
        raise NotImplementedError

    def _sink_options(self, target: str) -> list[str]:
        """The sink's options for serving into `target` (a table or an index)."""
        raise NotImplementedError

    def _server_pid(self) -> int | None:
        """The throwaway store's server process (None: a configured store)."""
        return None

    def _sink_env(self) -> dict[str, str]:
        raise NotImplementedError

    def _make_reader(self) -> ServedReader:
        raise NotImplementedError

    def _remove_store(self) -> None:
        """Remove what `_start_store` and the sink created for this run."""

    def redact(self, text: str) -> str:
        """`text` without the store's credentials."""
        return text

    def start(self, prefix: str, env: dict[str, str], cpu: Any) -> None:
        """The store (when none is configured), then the sink; returns once it follows."""
        self._start_store(cpu)
        self._command_prefix, self._env = prefix, env
        ready = self.work / f"{self.tag}.serve-ready"
        ready.unlink(missing_ok=True)
        self.sink = self._sink("serve", self.target, "--follow", "--ready-file", str(ready))
        cpu.watch(SINK_CPU, self.sink.pid)
        self.sink.wait_file(ready, timeout=120)
        self.reader = self._make_reader()
        self.reader.start()

    def wait(self, total: int, grace: float, cap_s: float) -> None:
        """After producing: until every message is served, or no progress for `grace` s."""
        reader = self.reader
        if reader is None:
            return
        cap = time.monotonic() + cap_s
        while reader.seen < total and reader.error is None and time.monotonic() < cap:
            if time.monotonic() - reader.last_progress > grace:
                log.warning("serving: nothing new in %s for %g s: giving up", self.system, grace)
                return
            if self.sink is not None and not self.sink.alive():
                tail = self.redact(self.sink.stderr_tail(5))
                self.errors.append(f"the serving sink died: {tail}")
                return
            time.sleep(0.25)

    def stop(self, replay: bool = False) -> None:
        """Stop the reader and the sink (keeping its report); with `replay`, measure the
        sink alone (`replay_report`); then remove the store."""
        try:
            if self.reader is not None:
                self.reader.stop_event.set()
                self.reader.join(30)
                if self.reader.error is not None:
                    self.errors.append(
                        f"served reader failed: {self.redact(str(self.reader.error))}"
                    )
            if self.sink is not None:
                rc = self.sink.stop()
                self.report = self.sink.stdout_json()
                if rc not in (0, None):
                    tail = self.redact(self.sink.stderr_tail(5))
                    self.errors.append(f"serving sink exited with status {rc}: {tail}")
            if self.reader is not None and self.reader.error is None:
                try:
                    self.reader.finish()
                except Exception as exc:  # noqa: BLE001 - reported, the store still goes
                    self.errors.append(f"served reader failed: {self.redact(str(exc))}")
            if replay and self.sink is not None and not self.errors:
                self.replay_report = self._replay()
        finally:
            self._remove_store()

    def _replay(self) -> dict[str, Any]:
        """The sink alone: a fresh sink (`--once`) loads the unified table's net content
        into a fresh target while nothing else runs; rows per second over its whole run
        (start, reading the table, loading), and the CPU of the sink and the server."""
        from deltabus_bench.environment import process_tree_cpu_s

        target = f"{self.target}_replay"
        server_pid = self._server_pid()
        server_before = process_tree_cpu_s(server_pid) if server_pid else None
        children_before = _children_cpu_s()
        started = time.monotonic()
        sink = self._sink("replay", target, "--once")
        rc = sink.wait(timeout=REPLAY_TIMEOUT_S)
        elapsed = time.monotonic() - started
        sink_cpu = _children_cpu_s() - children_before  # the only child ended meanwhile
        server_after = process_tree_cpu_s(server_pid) if server_pid else None
        report = sink.stdout_json() or {}
        if rc != 0:
            tail = self.redact(sink.stderr_tail(5))
            self.errors.append(f"the replaying sink exited with status {rc}: {tail}")
        rows = report.get(self.rows_key)
        out: dict[str, Any] = {
            "target": target,
            "rows": rows,
            "elapsed_s": round(elapsed, 3),
            "rows_per_s": round(rows / elapsed) if rows and elapsed > 0 else None,
            "sink_cpu_s": round(sink_cpu, 2),
            "server_cpu_s": None,
            "sink_report": report,
        }
        if server_before is not None and server_after is not None:
            out["server_cpu_s"] = round(server_after - server_before, 2)
        log.info(
            "serving replay: %s rows into %s in %.1f s (%s rows/s), sink %.1f CPU-s, server %s",
            rows,
            target,
            elapsed,
            out["rows_per_s"],
            sink_cpu,
            out["server_cpu_s"],
        )
        return out

    def _sink(self, role: str, target: str, *options: str) -> ChildProcess:
        """A `deltabus serve <backend>` child into `target` with `options`, started."""
        command = deltabus_command(
            "serve",
            self.backend,
            *options,
            *self._sink_options(target),
            prefix=self._command_prefix,
            as_json=True,
        )
        name = f"{self.tag}-{role}-{self.backend}"
        return ChildProcess(name, command, self._env | self._sink_env(), self.work).start()

    def served(self) -> pa.Table:
        return self.reader.table() if self.reader is not None else SERVED_SCHEMA.empty_table()


def _children_cpu_s() -> float:
    """CPU seconds of this process' children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _r(x: Any) -> float | None:
    return None if x is None else round(float(x), 4)


def _percentiles(row: dict[str, Any]) -> Percentiles:
    """p50, p99, p99.9 and max of a percentile_sql row, to 0.1 ms."""
    return Percentiles.model_validate({k: _r(row[k]) for k in ("p50", "p99", "p99.9", "max")})


def serving_summary(
    samples: pa.Table,
    served: pa.Table,
    *,
    warmup_s: float,
    interval_s: float,
    classify: Callable[[list[dict[str, Any]], float | None, int], Verdict],
    backend: str = "postgres",
) -> Serving:
    """The serving stage of one run: the backend, percentiles of unified commit → served
    and sent → served, the verdict and how many messages after the warm-up were never
    served (the sink's CPU and report are the caller's to add)."""
    con = duckdb.connect()
    con.register("samples_arrow", samples)
    con.register("served", served)
    con.execute(
        """CREATE TEMP TABLE serve_samples AS
           SELECT s.message, s.sent_ms, s.unified_commit_ms, v.served_ms,
                  v.served_ms - s.unified_commit_ms AS stage_ms,
                  v.served_ms - s.sent_ms AS latency_ms
           FROM samples_arrow s JOIN served v USING (message)"""
    )
    start = con.execute("SELECT min(sent_ms) FROM samples_arrow").fetchone()[0] or 0.0
    where = f"sent_ms >= {start + warmup_s * 1000}"
    names = ["samples", *PERCENTILES, "max"]
    stage = dict(
        zip(
            names,
            con.execute(percentile_sql("serve_samples", "stage_ms", where)).fetchone(),
            strict=True,
        )
    )
    e2e = dict(
        zip(
            names,
            con.execute(percentile_sql("serve_samples", "latency_ms", where)).fetchone(),
            strict=True,
        )
    )
    not_served = con.execute(
        f"SELECT count(*) FROM samples_arrow s ANTI JOIN served v USING (message) WHERE {where}"
    ).fetchone()[0]
    series = over_time(con, "serve_samples", interval_s)
    verdict = classify(series, e2e["p99"], int(not_served))
    return Serving(
        backend=backend,
        samples=int(stage["samples"]),
        not_served=int(not_served),
        stage=_percentiles(stage),
        end_to_end=_percentiles(e2e),
        verdict=verdict.verdict,
        behind=verdict,
    )


def unserved_is_loss(sink_report: dict | None) -> bool:
    """Whether messages not served when the benchmark stopped waiting are lost: only when
    the sink had applied every unified version it knew of (a sink still behind them has a
    backlog), or left no report."""
    report = sink_report or {}
    return report.get("version", -1) >= report.get("unified_version", -1)
