"""Connecting to PostgreSQL: the DSN as a secret, one clear error for what a user must fix.

The DSN carries a password, so it is never printed: `describe` names user, host, port
and database only, and `redact` removes the password (and the DSN) from any text that
reaches a user. Failures are sorted the way storage failures are (deltabus.core.retry): a
wrong password, a missing role or database, a refused or unresolvable server at start
are `DeltabusError`s (exit 2); a server that goes away mid-stream (restart, failover,
network) is transient and retried.
"""

from __future__ import annotations

import re
from typing import Any

from deltabus.core.errors import ConfigError, DeltabusError
from deltabus.core.errors import PostgresUnreachable as PostgresUnreachable
from deltabus.core.retry import verdict

APPLICATION_NAME = "deltabus-serve"
CONNECT_TIMEOUT_S = 5

# Failures a user must fix, by SQLSTATE (the server's answer): problem, fix.
_CREDENTIALS = (
    "PostgreSQL rejected the credentials",
    "check the user and password in DELTABUS_POSTGRES_DSN (or --dsn)",
)
_HBA = (
    "PostgreSQL does not accept connections from this host/user (pg_hba.conf)",
    "allow this client in the server's pg_hba.conf, or check DELTABUS_POSTGRES_DSN",
)
_MISSING = (
    "PostgreSQL: the role or database does not exist",
    "create it, or name an existing one in DELTABUS_POSTGRES_DSN",
)
_PRIVILEGE = (
    "PostgreSQL denied the sink's user",
    "grant the user CREATE on the schema (for the served and position tables) and "
    "INSERT, UPDATE, DELETE, SELECT on them",
)
_FULL = (
    "PostgreSQL has no space left for the served table",
    "free space on the PostgreSQL server's disk",
)
_READ_ONLY = (
    "PostgreSQL is read-only here (a standby?)",
    "point DELTABUS_POSTGRES_DSN at the primary server",
)
_NO_HOST = (
    "the PostgreSQL host name does not resolve",
    "check the host in DELTABUS_POSTGRES_DSN",
)
_USER_SQLSTATES: dict[str, tuple[str, str]] = {
    "28P01": _CREDENTIALS,  # invalid_password
    "28000": _HBA,  # invalid_authorization_specification
    "3D000": _MISSING,  # invalid_catalog_name
    "42501": _PRIVILEGE,  # insufficient_privilege
    "53100": _FULL,  # disk_full
    "25006": _READ_ONLY,  # read_only_sql_transaction
}
# A failed connection carries no SQLSTATE in psycopg2, only libpq's message: whole phrases
# as the server and libpq write them, tried in this order.
_CONNECT_FAILURES = (
    (re.compile(r"\bpassword authentication failed for user\b"), _CREDENTIALS),
    (re.compile(r"\bno pg_hba\.conf entry for\b"), _HBA),
    (re.compile(r'\b(?:role|database) "[^"]*" does not exist\b'), _MISSING),
    (re.compile(r"\bpermission denied for\b"), _PRIVILEGE),
    (re.compile(r"\bcould not translate host name\b"), _NO_HOST),
)


def parse(dsn: str) -> dict[str, str]:
    """The DSN's parts (libpq's own parser); ConfigError, without the DSN, when invalid."""
    from psycopg2.extensions import parse_dsn

    try:
        return parse_dsn(dsn)
    except Exception:  # noqa: BLE001 - its message can echo the DSN, password included
        raise ConfigError(
            "DELTABUS_POSTGRES_DSN (or --dsn) is not a valid PostgreSQL connection string",
            "use postgresql://USER:PASSWORD@HOST:PORT/DATABASE or 'host=... port=... "
            "user=... password=... dbname=...'",
        ) from None


def describe(dsn: str) -> str:
    """user@host:port/database, never the password."""
    parts = parse(dsn)
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    return (
        f"PostgreSQL {parts.get('user') or '(default user)'}@{host}:{parts.get('port') or 5432}"
        f"/{parts.get('dbname') or '(default database)'}"
    )


def _secrets_in(dsn: str) -> list[str]:
    found = [dsn]
    try:
        password = parse(dsn).get("password")
        if password:
            found.append(password)
    except ConfigError:
        pass
    found += re.findall(r"password\s*=\s*'?([^'\s]+)", dsn)
    found += re.findall(r"://[^:/@]*:([^@]+)@", dsn)
    return sorted({s for s in found if s}, key=len, reverse=True)


def redact(text: str, dsn: str | None) -> str:
    """`text` without the DSN or its password."""
    if not dsn:
        return text
    for secret in _secrets_in(dsn):
        text = text.replace(secret, "***")
    return text


def _user_failure(exc: BaseException) -> tuple[str, str] | None:
    """(problem, fix) when `exc` is a PostgreSQL failure a user must fix."""
    code = getattr(exc, "pgcode", None)
    if code:
        return _USER_SQLSTATES.get(code)
    text = str(exc)
    return next((found for pattern, found in _CONNECT_FAILURES if pattern.search(text)), None)


def is_transient(exc: BaseException) -> bool:
    """True for failures a PostgreSQL outage explains (it will come back): by SQLSTATE
    (connection exceptions, shutdown, starting up, too many connections, serialization),
    else by libpq's own phrases for a server that went away (deltabus.core.retry.verdict)."""
    import psycopg2

    if isinstance(exc, DeltabusError) or not isinstance(exc, psycopg2.Error):
        return False
    if _user_failure(exc) is not None:
        return False
    return bool(verdict(exc))


def user_error(exc: BaseException, dsn: str) -> DeltabusError | None:
    """The one clear error for a PostgreSQL failure a user must fix, or None."""
    import psycopg2

    if isinstance(exc, DeltabusError):
        return exc
    if not isinstance(exc, psycopg2.Error):
        return None
    where = describe(dsn)
    first = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else "", dsn)
    failure = _user_failure(exc)
    if failure is not None:
        problem, fix = failure
        return ConfigError(f"{problem} ({where}): {first}", fix)
    if isinstance(exc, psycopg2.OperationalError) and verdict(exc):
        return PostgresUnreachable(
            f"cannot reach {where}: {first}",
            "start PostgreSQL, or point DELTABUS_POSTGRES_DSN (or --dsn) at a running server",
        )
    return None


def open_connection(dsn: str) -> Any:
    """A psycopg2 connection (autocommit off, UTF-8); psycopg2's errors pass through."""
    import psycopg2

    con = psycopg2.connect(
        dsn, connect_timeout=CONNECT_TIMEOUT_S, application_name=APPLICATION_NAME
    )
    con.set_client_encoding("UTF8")
    return con


def connect(dsn: str) -> Any:
    """A connection, or the one clear error when the server cannot be used: wrong
    password, missing role or database, nothing listening (no retry: this is the check
    at start; an outage later is retried by the caller)."""
    import psycopg2

    parse(dsn)
    try:
        return open_connection(dsn)
    except psycopg2.Error as exc:
        raise user_error(exc, dsn) or DeltabusError(
            f"cannot connect to {describe(dsn)}: {redact(str(exc).strip(), dsn)[:300]}",
            "check DELTABUS_POSTGRES_DSN",
        ) from None
