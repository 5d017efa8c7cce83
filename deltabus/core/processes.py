"""Child processes of the engine: their command lines, environment, start, ready, stop.

Every layer that starts a `deltabus` child (the demo, the service, Dagster, the
benchmark) builds its environment and waits for it to be ready here, so they cannot
drift apart; what each command's arguments are belongs to the layer that owns it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from deltabus.core.errors import DeltabusError
from deltabus.core.settings import ENV_FILE_VAR, Settings

log = logging.getLogger(__name__)

# Environment every deltabus process runs with, unless the user set otherwise.
PROCESS_DEFAULTS = {"GX_ANALYTICS_ENABLED": "false"}
LAKE_ENV_PREFIXES = ("DELTABUS_", "MINIO_S3_")
# The standard AWS chain's variables (keys, profile, web identity, container role, region).
AWS_ENV_PREFIX = "AWS_"


def apply_process_defaults(env: dict[str, str] | None = None) -> None:
    """Set `PROCESS_DEFAULTS` in `env` (this process's environment by default)."""
    target = os.environ if env is None else env
    for key, value in PROCESS_DEFAULTS.items():
        target.setdefault(key, value)


def child_env(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child that must use exactly `settings`.

    Inherited lake variables are dropped and the settings file is empty, so neither the
    parent's environment nor a `.env` in the child's directory can point it elsewhere.
    The AWS_* variables pass on when the credentials come from the AWS chain (the child
    resolves and refreshes them itself) and are dropped otherwise. Holds the secret key:
    pass it to the child only.
    """
    dropped = LAKE_ENV_PREFIXES
    if not settings.uses_aws_chain:
        dropped = (*LAKE_ENV_PREFIXES, AWS_ENV_PREFIX)
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    apply_process_defaults(env)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings.to_env())
    env[ENV_FILE_VAR] = os.devnull
    env.update(extra or {})
    return env


def deltabus_command(*args: str, prefix: str | None = None, as_json: bool = False) -> list[str]:
    """`python -m deltabus [--json] [--prefix P] ARGS` with this interpreter."""
    return [
        sys.executable,
        "-m",
        "deltabus",
        *(["--json"] if as_json else []),
        *(["--prefix", prefix] if prefix else []),
        *args,
    ]


def wait_for_file(
    path: Path,
    alive: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    hint: str = "",
    interval: float = 0.05,
) -> None:
    """Wait until `path` exists (a ready file), failing clearly if the process ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if not alive():
            raise DeltabusError(f"{what} exited during start-up", hint)
        if time.monotonic() > deadline:
            raise DeltabusError(f"{what} was not ready after {timeout:.0f}s", hint)
        time.sleep(interval)


def read_ready_file(path: Path) -> dict:
    """What an ETL wrote into its ready file: pid, epoch, mode."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def process_alive(pid: int | None, *markers: str) -> bool:
    """True while `pid` runs (not a zombie) and its command line holds every marker.

    The markers guard against a recycled pid that now belongs to something else.
    """
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            with_parent_reap(pid)
            return False
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    return all(marker in cmdline for marker in markers)


def with_parent_reap(pid: int) -> None:
    """Reap `pid` if it is our own finished child (else it stays a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_pid(pid: int, timeout: float = 30.0, name: str = "process") -> None:
    """SIGTERM (after SIGCONT, in case it was stopped), then SIGKILL after `timeout`."""
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            log.warning("%s (pid %d) did not stop within %.0fs; killing it", name, pid, timeout)
            proc.kill()
            proc.wait(10)
    except psutil.NoSuchProcess:
        pass
    with_parent_reap(pid)


def spawn(
    args: list[str],
    log_path: Path,
    *,
    stdout_path: Path | None = None,
    new_session: bool = True,
    **popen: object,
) -> subprocess.Popen:
    """Start `args` with stderr appended to `log_path`, and stdout too unless `stdout_path`
    (then appended there); in a session of its own unless `new_session` is False, so a
    signal to the caller's terminal does not reach it. `popen` goes to `subprocess.Popen`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as err:
        if stdout_path is None:
            return subprocess.Popen(  # type: ignore[call-overload]
                args, stdout=err, stderr=subprocess.STDOUT, start_new_session=new_session, **popen
            )
        with open(stdout_path, "ab") as out:
            return subprocess.Popen(  # type: ignore[call-overload]
                args, stdout=out, stderr=err, start_new_session=new_session, **popen
            )


class ChildProcess:
    """A child in its own session, stdout and stderr in files of `log_dir`."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log_dir: Path) -> None:
        self.name = name
        self.args = args
        self.env = dict(env)
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None

    def start(self, cwd: str | os.PathLike[str] | None = None) -> ChildProcess:
        self.proc = spawn(
            self.args, self.stderr_path, stdout_path=self.stdout_path, env=self.env, cwd=cwd
        )
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_file(self, path: Path, timeout: float = 180) -> None:
        """Wait for the child's ready file; fail clearly if it exits first."""
        wait_for_file(
            path, self.alive, what=self.name, timeout=timeout, hint=f"see {self.stderr_path}"
        )

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)  # type: ignore[union-attr]

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        self.returncode = self.proc.wait(timeout)
        return self.returncode

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            stop_pid(self.proc.pid, timeout, self.name)
        self.returncode = self.proc.wait()
        return self.returncode

    def stdout_json(self) -> dict | None:
        """The last JSON line the child printed (its `--json` report)."""
        try:
            lines = self.stdout_path.read_text().strip().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            try:
                return json.loads(line)
            except ValueError:
                continue
        return None

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
