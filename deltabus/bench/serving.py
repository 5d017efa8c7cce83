"""`deltabus bench --serve postgres`: the serving sink under load, as its own stage.

Per run: a PostgreSQL (DELTABUS_POSTGRES_DSN, else a throwaway one on loopback), the sink
as its own process (`deltabus serve postgres --follow`), and a reader in the benchmark
process that polls the served table for rows of versions it has not seen
(`WHERE version > last`, on the table's version index) and stamps when each message
became visible in PostgreSQL. The stage "unified commit → visible in PostgreSQL" is that
moment minus the unified commit the Delta consumer saw the row in; the serving verdict
applies the benchmark's rule (deltabus.bench.verdict) to sent → visible in PostgreSQL.
CPU is measured for the sink and for PostgreSQL (the postmaster and all its processes).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from deltabus.latency import PERCENTILES, over_time, percentile_sql
from deltabus.processes import ChildProcess, deltabus_command

log = logging.getLogger("deltabus.bench")

SERVED_SCHEMA = pa.schema([("message", pa.string()), ("served_ms", pa.float64())])
SERVE_BACKENDS = ("postgres",)


class ServedReader(threading.Thread):
    """Polls the served table for new versions; records when each message showed up."""

    def __init__(self, dsn: str, table: str, poll_s: float) -> None:
        super().__init__(name="served-reader", daemon=True)
        self.dsn, self.served_table, self.poll_s = dsn, table, poll_s
        self.stop_event = threading.Event()
        self.messages: list[list[str]] = []
        self.stamps: list[np.ndarray] = []
        self.seen = 0
        self.last_progress = time.monotonic()
        self.error: BaseException | None = None

    def run(self) -> None:
        from deltabus.serving import pg

        last = -1
        con = None
        try:
            while not self.stop_event.is_set():
                try:
                    if con is None:
                        con = pg.open_connection(self.dsn)
                        con.autocommit = True
                    with con.cursor() as cur:
                        cur.execute(
                            f"SELECT message, version FROM {self.served_table} WHERE version > %s",
                            (last,),
                        )
                        rows = cur.fetchall()
                except Exception as exc:
                    if not pg.is_transient(exc):
                        raise
                    con = None
                    rows = []
                if rows:
                    now = time.time() * 1000
                    self.messages.append([r[0] for r in rows])
                    self.stamps.append(np.full(len(rows), now))
                    last = max(r[1] for r in rows)
                    self.seen += len(rows)
                    self.last_progress = time.monotonic()
                self.stop_event.wait(self.poll_s)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the runner
            log.exception("served reader failed")
            self.error = exc
        finally:
            if con is not None:
                con.close()

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
    """PostgreSQL, the sink process and the reader for one benchmark run."""

    def __init__(self, settings: Any, work: Path, tag: str, poll_s: float) -> None:
        self.settings, self.work, self.tag, self.poll_s = settings, work, tag, poll_s
        self.server = None
        self.sink: ChildProcess | None = None
        self.reader: ServedReader | None = None
        self.report: dict | None = None
        self.errors: list[str] = []
        if settings.postgres_dsn is not None:
            self.dsn = settings.postgres_dsn.get_secret_value()
            self.table = f"served_bench_{uuid.uuid4().hex[:8]}"
        else:
            self.dsn, self.table = "", "served_unified"

    def start(self, prefix: str, env: dict[str, str], cpu: Any) -> None:
        """PostgreSQL (when none is configured), then the sink; returns once it follows."""
        if not self.dsn:
            from deltabus.local_postgres import PostgresServer

            self.server = PostgresServer().start()
            self.dsn = self.server.dsn
            cpu.watch("postgresql", self.server.process.pid, tree=True)
        ready = self.work / f"{self.tag}.serve-ready"
        ready.unlink(missing_ok=True)
        command = deltabus_command(
            "serve",
            "postgres",
            "--follow",
            "--table",
            self.table,
            "--ready-file",
            str(ready),
            prefix=prefix,
            as_json=True,
        )
        self.sink = ChildProcess(
            f"{self.tag}-serve-postgres",
            command,
            env | {"DELTABUS_POSTGRES_DSN": self.dsn},
            self.work,
        ).start()
        cpu.watch("serve sink", self.sink.pid)
        self.sink.wait_file(ready, timeout=120)
        self.reader = ServedReader(self.dsn, self.table, self.poll_s)
        self.reader.start()

    def wait(self, total: int, grace: float, cap_s: float) -> None:
        """After producing: until every message is served, or no progress for `grace` s."""
        reader = self.reader
        if reader is None:
            return
        cap = time.monotonic() + cap_s
        while reader.seen < total and reader.error is None and time.monotonic() < cap:
            if time.monotonic() - reader.last_progress > grace:
                log.warning("serving: no new rows in PostgreSQL for %g s: giving up", grace)
                return
            if self.sink is not None and not self.sink.alive():
                self.errors.append(f"the serving sink died: {self.sink.stderr_tail(5)}")
                return
            time.sleep(0.25)

    def stop(self) -> None:
        if self.reader is not None:
            self.reader.stop_event.set()
            self.reader.join(30)
            if self.reader.error is not None:
                self.errors.append(f"served reader failed: {self.reader.error}")
        if self.sink is not None:
            rc = self.sink.stop()
            self.report = self.sink.stdout_json()
            if rc not in (0, None):
                self.errors.append(
                    f"serving sink exited with status {rc}: {self.sink.stderr_tail(5)}"
                )
        if self.server is not None:
            self.server.cleanup()

    def served(self) -> pa.Table:
        return self.reader.table() if self.reader is not None else SERVED_SCHEMA.empty_table()


def _r(x: Any) -> float | None:
    return None if x is None else round(float(x), 4)


def serving_summary(
    samples: pa.Table, served: pa.Table, *, warmup_s: float, interval_s: float, classify: Any
) -> dict[str, Any]:
    """The serving stage of one run: percentiles, the verdict, what was not served."""
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
    verdict = classify(series, e2e["p99"])
    return {
        "samples": int(stage["samples"]),
        "not_served": int(not_served),
        "unified_commit_to_postgres": {k: _r(stage[k]) for k in ("p50", "p99", "p99.9", "max")},
        "sent_to_postgres": {k: _r(e2e[k]) for k in ("p50", "p99", "p99.9", "max")},
        "verdict": verdict["verdict"],
        "behind": verdict,
    }
