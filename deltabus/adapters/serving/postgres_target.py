"""The served table and the sink's position in PostgreSQL, changed in one transaction.

Exactly once rests on one row: `deltabus_sink_position (sink, source_table, version)`
holds the last `timezone_unified` version whose changes are in the served table, and
every transaction that changes the served table moves it, after locking it and checking
it is where this sink left it. A transaction commits rows and position together or not
at all, so a sink that restarts (or reconnects after an outage, not knowing whether its
last COMMIT landed) reads the position back and goes on after it: nothing is applied
twice, nothing skipped. A second sink of the same name finds the position moved, and
starts again from it instead of writing over it.

Rows go in through COPY into a temporary staging table, then one DELETE (retractions)
and one INSERT ... ON CONFLICT (message, message_escaped) DO UPDATE (insertions): a few
statements per transaction, whatever the number of rows.

Every message is served. PostgreSQL text cannot hold a NUL character, so a message that
holds one is stored as its JSON string literal with `message_escaped` true (`message_text`
gives it back); every other message is stored as it is, with `message_escaped` false.
The key is the pair, so an escaped form never meets a message that reads the same.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import polars as pl
import pyarrow as pa

from deltabus.adapters.serving import pg
from deltabus.adapters.serving.changes import message_changes
from deltabus.adapters.serving.sink_loop import Applied, PositionMovedError
from deltabus.core.errors import ConfigError, DeltabusError

log = logging.getLogger(__name__)

POSITION_TABLE = "deltabus_sink_position"
STAGE_TABLE = "deltabus_serve_stage"
DEFAULT_TABLE = "served_unified"
TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
SERVED_COLUMNS = {
    "message": "text",
    "message_escaped": "boolean",
    "timestamp": "double precision",
    "time": "bigint",
    "version": "bigint",
}
# A served table laid out without `message_escaped`, which cannot hold a message with a NUL.
UNESCAPED_COLUMNS = {k: v for k, v in SERVED_COLUMNS.items() if k != "message_escaped"}
STAGE_COLUMNS = ("message", "message_escaped", "timestamp", "time", "version", "diff")
NUL = "\x00"


def check_table_name(name: str) -> str:
    """A served table name: an unquoted lower-case PostgreSQL identifier (no schema)."""
    if not TABLE_NAME.fullmatch(name) or name in (POSITION_TABLE, STAGE_TABLE):
        raise ConfigError(
            f"--table {name!r} is not a usable table name",
            "use 1-63 lower-case letters, digits and '_', starting with a letter or '_'",
        )
    return name


def escape_message(message: str) -> str:
    """The stored form of a message holding a NUL: its JSON string literal (no NUL)."""
    return json.dumps(message, ensure_ascii=False)


def message_text(stored: str, escaped: bool) -> str:
    """The message a served row stands for (the inverse of the stored form)."""
    return json.loads(stored) if escaped else stored


def storable(changes: pl.DataFrame) -> pl.DataFrame:
    """`changes` with each message in the form PostgreSQL text holds (STAGE_COLUMNS)."""
    nul = changes["message"].str.contains(NUL, literal=True).fill_null(False)
    plain = changes.filter(~nul).with_columns(message_escaped=pl.lit(False))
    if not nul.any():
        return plain.select(STAGE_COLUMNS)
    held = changes.filter(nul)
    escaped = held.with_columns(
        message=pl.Series([escape_message(m) for m in held["message"]], dtype=pl.String),
        message_escaped=pl.lit(True),
    )
    return pl.concat([plain, escaped]).select(STAGE_COLUMNS)


def net_changes(rows: pa.Table | None) -> pl.DataFrame:
    """What a run of unified rows (in version order) changes in the served table
    (deltabus.adapters.serving.changes), every message in its stored form (STAGE_COLUMNS)."""
    return storable(message_changes(rows))


class PostgresTarget:
    """One served table and its sink's position row, over one connection."""

    system = "PostgreSQL"

    def __init__(self, dsn: str, table: str, source: str, sink: str | None = None) -> None:
        self.dsn = dsn
        self.table = check_table_name(table)
        self.sink = sink or table
        self.source = source  # the Delta table served, by URI: one source per sink
        self.con: Any = None

    def describe(self) -> str:
        return f"table {self.table} on {pg.describe(self.dsn)}"

    def recreated_hint(self) -> str:
        return (
            f"drop the served table and its row in {POSITION_TABLE} to serve the new table "
            "from its start"
        )

    def is_transient(self, exc: BaseException) -> bool:
        return pg.is_transient(exc)

    def user_error(self, exc: BaseException) -> DeltabusError | None:
        return pg.user_error(exc, self.dsn)

    def redact(self, text: str) -> str:
        return pg.redact(text, self.dsn)

    def changes(self, rows: pa.Table | None) -> pl.DataFrame:
        return net_changes(rows)

    def snapshot_version(self, latest: int) -> int:
        """A snapshot loads in one transaction: always the newest version."""
        return latest

    # -- connection and schema ------------------------------------------------------------

    def open(self, checked: bool = True) -> None:
        """Connect and make sure the tables exist. `checked`: a problem becomes one clear
        error (start); otherwise psycopg2's errors pass through to be retried."""
        self.close()
        self.con = pg.connect(self.dsn) if checked else pg.open_connection(self.dsn)
        try:
            self._prepare()
        except Exception as exc:
            error = pg.user_error(exc, self.dsn) if checked else None
            self.close()
            if error is not None:
                raise error from None
            raise

    def connected(self) -> bool:
        return self.con is not None and not self.con.closed

    def close(self) -> None:
        if self.con is not None:
            try:
                self.con.close()
            except Exception:  # noqa: BLE001 - a dead connection has nothing to close
                pass
            self.con = None

    def _prepare(self) -> None:
        from psycopg2 import sql

        t = sql.Identifier(self.table)
        cols = sql.SQL(", ").join(
            sql.SQL("{} {} NOT NULL").format(sql.Identifier(c), sql.SQL(kind))
            for c, kind in SERVED_COLUMNS.items()
        )
        with self.con.cursor() as cur:
            cur.execute(
                f"""CREATE TABLE IF NOT EXISTS {POSITION_TABLE} (
                      sink text PRIMARY KEY,
                      source_table text NOT NULL,
                      version bigint NOT NULL,
                      source_commit_ms bigint,
                      updated_at timestamptz NOT NULL DEFAULT now())"""
            )
            cur.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY (message, message_escaped))"
                ).format(t, cols)
            )
            cur.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (version)").format(
                    sql.Identifier(f"{self.table}_version_idx"), t
                )
            )
            self._check_columns(cur)
            cur.execute(
                f"SELECT source_table FROM {POSITION_TABLE} WHERE sink = %s FOR UPDATE",
                (self.sink,),
            )
            row = cur.fetchone()
            if row is None:
                cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(t))
                if cur.fetchone()[0]:
                    raise ConfigError(
                        f"{self.describe()} has rows but no position in {POSITION_TABLE}: "
                        "the sink cannot tell which changes they hold",
                        "drop or empty that table, or serve into another --table",
                    )
                cur.execute(
                    f"INSERT INTO {POSITION_TABLE} (sink, source_table, version) "
                    "VALUES (%s, %s, -1)",
                    (self.sink, self.source),
                )
            elif row[0] != self.source:
                raise ConfigError(
                    f"{self.describe()} serves {row[0]}, not {self.source}",
                    "serve this lake into another --table, or drop that table and its row "
                    f"in {POSITION_TABLE}",
                )
            cur.execute(
                f"""CREATE TEMP TABLE IF NOT EXISTS {STAGE_TABLE} (
                      message text, message_escaped boolean, "timestamp" double precision,
                      "time" bigint, version bigint, diff bigint) ON COMMIT DELETE ROWS"""
            )
        self.con.commit()

    def _check_columns(self, cur: Any) -> None:
        cur.execute(
            """SELECT column_name, data_type FROM information_schema.columns
               WHERE table_name = %s AND table_schema = current_schema()""",
            (self.table,),
        )
        found = dict(cur.fetchall())
        if found == UNESCAPED_COLUMNS:
            raise ConfigError(
                f"{self.describe()} has no message_escaped column, so it cannot hold "
                "messages with a NUL character, and any such message is missing from it",
                f"drop it and delete its row in {POSITION_TABLE} (sink = '{self.sink}'); "
                "the next start loads the unified table's net content afresh",
            )
        if found != SERVED_COLUMNS:
            raise ConfigError(
                f"{self.describe()} exists with other columns ({found}) than a served table "
                f"({SERVED_COLUMNS})",
                "serve into another --table, or drop that table",
            )

    # -- reading --------------------------------------------------------------------------

    def position(self) -> int:
        """The last unified version applied (-1: none yet)."""
        with self.con.cursor() as cur:
            cur.execute(f"SELECT version FROM {POSITION_TABLE} WHERE sink = %s", (self.sink,))
            row = cur.fetchone()
        self.con.commit()
        return -1 if row is None else int(row[0])

    def count(self) -> int:
        from psycopg2 import sql

        with self.con.cursor() as cur:
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(self.table)))
            n = int(cur.fetchone()[0])
        self.con.commit()
        return n

    # -- writing --------------------------------------------------------------------------

    def submit(
        self,
        changes: pl.DataFrame,
        expected: int,
        to_version: int,
        source_commit_ms: int,
        done: Callable[[Applied], None],
    ) -> None:
        """`apply`, at once: one transaction holds nothing in flight."""
        done(self.apply(changes, expected, to_version, source_commit_ms))

    def check(self) -> None:
        """Nothing is ever in flight."""

    def drain(self) -> None:
        """Nothing is ever in flight."""

    def apply(
        self, changes: pl.DataFrame, expected: int, to_version: int, source_commit_ms: int
    ) -> Applied:
        """Apply `changes` and move the position from `expected` to `to_version`, in one
        transaction. Raises PositionMovedError (nothing written) when the stored position
        is not `expected`."""
        from psycopg2 import sql

        t = sql.Identifier(self.table)
        inserted = deleted = escaped = 0
        try:
            with self.con.cursor() as cur:
                cur.execute(
                    f"SELECT version FROM {POSITION_TABLE} WHERE sink = %s FOR UPDATE",
                    (self.sink,),
                )
                row = cur.fetchone()
                stored = -1 if row is None else int(row[0])
                if row is None or stored != expected:
                    self.con.rollback()
                    raise PositionMovedError(stored)
                if changes.height:
                    buffer = io.BytesIO()
                    changes.select(STAGE_COLUMNS).write_csv(buffer, include_header=False)
                    buffer.seek(0)
                    cur.copy_expert(
                        f"COPY {STAGE_TABLE} (message, message_escaped, "
                        '"timestamp", "time", version, diff) FROM STDIN WITH (FORMAT csv)',
                        buffer,
                    )
                    if (changes["diff"] < 0).any():
                        cur.execute(
                            sql.SQL(
                                "DELETE FROM {} s USING {} d WHERE d.diff < 0 "
                                "AND s.message = d.message "
                                "AND s.message_escaped = d.message_escaped "
                                'AND s."timestamp" = d."timestamp"'
                            ).format(t, sql.Identifier(STAGE_TABLE))
                        )
                        deleted = cur.rowcount
                    if (changes["diff"] > 0).any():
                        cur.execute(
                            sql.SQL(
                                "INSERT INTO {} "
                                '(message, message_escaped, "timestamp", "time", version) '
                                'SELECT message, message_escaped, "timestamp", "time", version '
                                "FROM {} WHERE diff > 0 "
                                "ON CONFLICT (message, message_escaped) DO UPDATE SET "
                                '"timestamp" = EXCLUDED."timestamp", "time" = EXCLUDED."time", '
                                "version = EXCLUDED.version"
                            ).format(t, sql.Identifier(STAGE_TABLE))
                        )
                        inserted = cur.rowcount
                        escaped = int(
                            changes.filter((pl.col("diff") > 0) & pl.col("message_escaped")).height
                        )
                cur.execute(
                    f"UPDATE {POSITION_TABLE} SET version = %s, source_commit_ms = %s, "
                    "updated_at = now() WHERE sink = %s",
                    (to_version, source_commit_ms, self.sink),
                )
            self.con.commit()
        except PositionMovedError:
            raise
        except BaseException:
            try:
                self.con.rollback()
            except Exception:  # noqa: BLE001 - the connection may be gone: so is the txn
                pass
            raise
        return Applied(inserted, deleted, time.time() * 1000, escaped)
