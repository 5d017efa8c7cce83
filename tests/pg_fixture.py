"""A real PostgreSQL for the tests: DELTABUS_TEST_POSTGRES_DSN, else a local server on loopback.

The local server is Debian's PostgreSQL (initdb + postgres) in a temporary directory on a
free 127.0.0.1 port with a random password (deltabus.adapters.dev.postgres_process). In CI a missing
PostgreSQL is a failure, never a skip. The serving setting DELTABUS_POSTGRES_DSN is never
read here (tests/conftest.py removes it): a user's server is used only when named by
DELTABUS_TEST_POSTGRES_DSN.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from deltabus.adapters.dev.postgres_process import PostgresServer, find_bindir

IN_CI = os.environ.get("CI", "").lower() == "true"
TEST_DSN_VAR = "DELTABUS_TEST_POSTGRES_DSN"


@dataclass
class Postgres:
    dsn: str  # holds the password: pass it to children's environments only
    server: PostgresServer | None  # None: an existing server named by TEST_DSN_VAR


def require_postgres_binaries() -> None:
    """Skip (fail in CI) when the PostgreSQL server binaries are not installed."""
    if find_bindir() is None:
        message = "the PostgreSQL server (initdb, postgres) is not installed"
        if IN_CI:
            pytest.fail(f"PostgreSQL is required in CI: {message} (apt-get install postgresql)")
        pytest.skip(f"{message}; install postgresql or set {TEST_DSN_VAR}")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """One PostgreSQL for the whole session (tests use their own table names)."""
    dsn = os.environ.get(TEST_DSN_VAR)
    if dsn:
        yield Postgres(dsn, None)
        return
    require_postgres_binaries()
    server = PostgresServer()
    server.start()
    try:
        yield Postgres(server.dsn, server)
    finally:
        server.cleanup()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, for tests that stop and restart it."""
    require_postgres_binaries()
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()
