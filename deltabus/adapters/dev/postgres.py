"""`deltabus postgres up/down`: a persistent local PostgreSQL for development and the demo.

`up` with no DELTABUS_POSTGRES_DSN configured initialises a server in the data directory,
starts it on 127.0.0.1 and appends its DSN (with a random password) to `.env`, mode 600,
as `deltabus minio up` does for MinIO's key. With a DSN configured it starts the server
of that directory again, or only checks that the configured server answers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from deltabus.adapters.dev.postgres_process import PostgresServer
from deltabus.adapters.dev.server import LOCAL_HOSTS
from deltabus.adapters.serving import pg
from deltabus.adapters.serving.settings import load_serving_settings
from deltabus.core.errors import ConfigError
from deltabus.core.net import free_port, port_taken
from deltabus.core.settings import append_env_file

DEFAULT_PORT = 55432


def _write_dsn(env_file: Path | None, dsn: str) -> Path:
    return append_env_file(
        env_file,
        [
            "# written by `deltabus postgres up`: the local development PostgreSQL",
            f"DELTABUS_POSTGRES_DSN={dsn}",
        ],
    )


def postgres_up(env_file: Path | None, data_dir: Path) -> str:
    """Start (or find) the development PostgreSQL; returns what was done, no password."""
    data_dir = data_dir.resolve()
    initialised = (data_dir / "data" / "PG_VERSION").is_file()
    configured = load_serving_settings(env_file).postgres_dsn
    if configured is None:
        if initialised:
            raise ConfigError(
                f"{data_dir} holds a development PostgreSQL, but DELTABUS_POSTGRES_DSN (with "
                "its password) is not configured",
                "restore the DELTABUS_POSTGRES_DSN line in .env, or remove "
                f"{data_dir} to start afresh",
            )
        port = free_port() if port_taken(DEFAULT_PORT) else DEFAULT_PORT
        server = PostgresServer(data_dir, port=port).start()
        written = _write_dsn(env_file, server.dsn)
        return f"{server.describe()} started (pid {server.process.pid}); DSN written to {written}"  # type: ignore[union-attr]
    dsn = configured.get_secret_value()
    try:
        pg.connect(dsn).close()
        return f"{pg.describe(dsn)} is running"
    except pg.PostgresUnreachable:
        parts = pg.parse(dsn)
        if not initialised or parts.get("host") not in LOCAL_HOSTS:
            raise
    server = PostgresServer(
        data_dir,
        port=int(parts.get("port", "5432")),
        user=parts.get("user", "deltabus"),
        password=parts.get("password"),
        database=parts.get("dbname", "deltabus"),
    ).start()
    return f"{server.describe()} started (pid {server.process.pid})"  # type: ignore[union-attr]


def postgres_down(data_dir: Path) -> str:
    """Fast shutdown of the development PostgreSQL of `data_dir` (its postmaster.pid)."""
    pid_file = data_dir / "data" / "postmaster.pid"
    if not pid_file.is_file():
        return f"no PostgreSQL running from {data_dir}"
    pid = int(pid_file.read_text().split()[0])
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return f"no PostgreSQL running from {data_dir} (stale pid {pid})"
    deadline = time.monotonic() + 30
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return f"stopped PostgreSQL (pid {pid})"
