"""A real PostgreSQL server on loopback, for tests, the demo and benchmarks on one machine.

The serving sink needs a PostgreSQL; when none is configured (`DELTABUS_POSTGRES_DSN`),
one is started from the distribution's server binaries (Debian's `postgresql` package):
`initdb` with a random password and scram-sha-256 authentication, then `postgres -D`
listening on 127.0.0.1 only, with its unix socket inside its own directory. PostgreSQL
refuses to run as root, so under root both run as the `postgres` system user (or
`nobody`), which then owns the server's directory.
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from deltabus.core.errors import DeltabusError
from deltabus.core.net import free_port
from deltabus.core.processes import spawn

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install the PostgreSQL server (Debian: apt-get install postgresql), or set "
    "DELTABUS_POSTGRES_DSN to an existing server"
)


def _has_server(bindir: Path) -> bool:
    return (bindir / "initdb").is_file() and (bindir / "postgres").is_file()


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path)) or (0,)


def find_bindir() -> Path | None:
    """The directory of `initdb` and `postgres`: `pg_config --bindir`, then Debian's
    /usr/lib/postgresql/<newest>/bin, then `initdb` on PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
        except (OSError, subprocess.SubprocessError):
            pass
    candidates += [
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key)[::-1]
    ]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    return next((c for c in candidates if _has_server(c)), None)


def require_bindir() -> Path:
    found = find_bindir()
    if found is None:
        raise DeltabusError(
            "the PostgreSQL server (initdb, postgres) is not installed", INSTALL_HINT
        )
    return found


def server_user() -> pwd.struct_passwd | None:
    """Who the server runs as: None (this user) unless we are root, who may not run it."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise DeltabusError(
        "running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL",
        "create one (useradd --system postgres), or set DELTABUS_POSTGRES_DSN",
    )


def _reachable(path: Path, user: pwd.struct_passwd) -> bool:
    """Can `user` walk down to `path` (execute permission on every parent)?"""
    for parent in [*reversed(path.resolve().parents)]:
        st = parent.stat()
        if st.st_uid == user.pw_uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == user.pw_gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return False
    return True


class PostgresServer:
    """One PostgreSQL server with its own directory (data, socket, log), on 127.0.0.1.

    `base_dir=None` uses a fresh temporary directory, removed by `cleanup()`. The
    password is random unless given (a development server keeps its password in .env).
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        port: int | None = None,
        user: str = "deltabus",
        password: str | None = None,
        database: str = "deltabus",
    ) -> None:
        self.bindir = require_bindir()
        self.run_as = server_user()
        self.temporary = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="deltabus-postgres-")).resolve()
        self.port = port or free_port()
        self.user = user
        self.password = password or secrets.token_urlsafe(18)
        self.database = database
        self.process: subprocess.Popen | None = None
        self.log_path = self.base_dir / "postgres.log"

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir / "socket"

    @property
    def dsn(self) -> str:
        """The libpq URI, with the password: give it to clients only, never print it."""
        password = quote(self.password, safe="")
        return f"postgresql://{self.user}:{password}@127.0.0.1:{self.port}/{self.database}"

    def describe(self) -> str:
        return f"PostgreSQL {self.user}@127.0.0.1:{self.port}/{self.database} in {self.base_dir}"

    # -- running as the server's user -----------------------------------------------------

    def _own(self, *paths: Path) -> None:
        if self.run_as is None:
            return
        for path in paths:
            os.chown(path, self.run_as.pw_uid, self.run_as.pw_gid)

    def _popen(
        self, args: list[str], new_session: bool = False, **kwargs: object
    ) -> subprocess.Popen:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        if self.run_as is not None:
            env["HOME"] = str(self.base_dir)
            kwargs.update(user=self.run_as.pw_uid, group=self.run_as.pw_gid, extra_groups=[])
        return spawn(args, self.log_path, new_session=new_session, env=env, **kwargs)

    # -- lifecycle ------------------------------------------------------------------------

    def init(self) -> None:
        """initdb, once: the superuser `user` with a scram-sha-256 password (from a
        password file that is removed again), UTF-8, no locale."""
        if (self.data_dir / "PG_VERSION").is_file():
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.run_as is not None and not _reachable(self.base_dir, self.run_as):
            raise DeltabusError(
                f"user '{self.run_as.pw_name}', who runs PostgreSQL, cannot reach {self.base_dir}",
                "choose a directory every user may traverse (e.g. under /var/tmp)",
            )
        self.base_dir.chmod(0o700)
        self.socket_dir.mkdir(exist_ok=True)
        pwfile = self.base_dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        self.log_path.touch()
        self._own(self.base_dir, self.socket_dir, pwfile)
        try:
            rc = self._popen(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    "-A",
                    "scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ]
            ).wait(120)
        finally:
            pwfile.unlink(missing_ok=True)
        if rc != 0:
            raise DeltabusError(f"initdb failed (status {rc})", f"see {self.log_path}")

    def start(self, timeout: float = 60) -> PostgresServer:
        """Start the server (initialising it first when needed) and wait until it answers."""
        self.init()
        self.process = self._popen(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.socket_dir}",
                "-c",
                "logging_collector=off",
            ],
            new_session=True,
        )
        self.wait_ready(timeout)
        self._ensure_database()
        log.info("%s started (pid %d)", self.describe(), self.process.pid)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _connect(self, database: str, timeout: float = 2):  # noqa: ANN202 - psycopg2 connection
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=database,
            connect_timeout=max(1, int(timeout)),
        )

    def wait_ready(self, timeout: float = 60) -> None:
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise DeltabusError(
                    f"PostgreSQL exited with status {self.process.returncode} on start",
                    f"see {self.log_path}",
                )
            try:
                self._connect("postgres").close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise DeltabusError(
                        f"PostgreSQL did not accept connections within {timeout:.0f}s",
                        f"see {self.log_path}",
                    ) from None
                time.sleep(0.1)

    def _ensure_database(self) -> None:
        con = self._connect("postgres")
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            con.close()

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT: sessions are ended, a checkpoint is written); SIGKILL
        when it takes longer than `timeout`."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("PostgreSQL did not stop within %.0fs; killing it", timeout)
                self.process.kill()
                self.process.wait()
        self.process = None

    def cleanup(self) -> None:
        """Stop the server and remove its directory when it was a temporary one."""
        self.stop()
        if self.temporary:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
