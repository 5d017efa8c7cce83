"""The PostgreSQL serving stage of a benchmark run: the sink into PostgreSQL (a throwaway
server unless DELTABUS_POSTGRES_DSN names one) and the reader that sees rows land."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from deltabus_bench.config import SERVER_CPU
from deltabus_bench.serving import ServedReader, ServingRun

log = logging.getLogger("deltabus_bench")


class PostgresReader(ServedReader):
    """Reads the served table's rows of versions above the highest seen (one transaction
    writes a run of versions, so a version is seen whole)."""

    def __init__(self, dsn: str, table: str, poll_s: float) -> None:
        super().__init__(poll_s)
        self.dsn, self.served_table = dsn, table
        self.last = -1
        self.con: Any = None

    def poll(self) -> tuple[list[str], int]:
        from deltabus.adapters.serving import pg

        if self.con is None:
            self.con = pg.open_connection(self.dsn)
            self.con.autocommit = True
        with self.con.cursor() as cur:
            cur.execute(
                f"SELECT message, version FROM {self.served_table} WHERE version > %s",
                (self.last,),
            )
            rows = cur.fetchall()
        if rows:
            self.last = max(r[1] for r in rows)
        return [r[0] for r in rows], len(rows)

    def is_transient(self, exc: BaseException) -> bool:
        from deltabus.adapters.serving import pg

        return pg.is_transient(exc)

    def reset(self) -> None:
        if self.con is not None:
            try:
                self.con.close()
            except Exception:  # noqa: BLE001 - a dead connection has nothing to close
                pass
            self.con = None


class PostgresServingRun(ServingRun):
    """`--serve postgres`: DELTABUS_POSTGRES_DSN (a fresh table per run), else a throwaway
    PostgreSQL on loopback."""

    backend = "postgres"
    rows_key = "served_rows"

    def __init__(self, settings: Any, work: Path, tag: str, poll_s: float) -> None:
        super().__init__(settings, work, tag, poll_s)
        self.server: Any = None
        if settings.postgres_dsn is not None:
            self.dsn = settings.postgres_dsn.get_secret_value()
            self.table = f"served_bench_{uuid.uuid4().hex[:8]}"
        else:
            self.dsn, self.table = "", "served_unified"

    def _start_store(self, cpu: Any) -> None:
        if self.dsn:
            return
        from deltabus.adapters.dev.postgres_process import PostgresServer

        self.server = PostgresServer().start()
        self.dsn = self.server.dsn
        cpu.watch(SERVER_CPU["postgres"], self.server.process.pid, tree=True)

    @property
    def target(self) -> str:
        return self.table

    def _sink_options(self, target: str) -> list[str]:
        return ["--table", target]

    def _server_pid(self) -> int | None:
        return self.server.process.pid if self.server is not None else None

    def _sink_env(self) -> dict[str, str]:
        return {"DELTABUS_POSTGRES_DSN": self.dsn}

    def _make_reader(self) -> ServedReader:
        return PostgresReader(self.dsn, self.table, self.poll_s)

    def _remove_store(self) -> None:
        if self.server is not None:
            self.server.cleanup()
