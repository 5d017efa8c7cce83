"""The continuous ETL as a service: started detached, watched, stopped, and its lag.

`deltabus etl --mode continuous` runs until SIGTERM. `EtlService` launches it detached
(its own session, re-parented away from the launcher, so a short-lived Dagster run can
start it), keeps a pid file, a log file and a small JSON state under a state directory,
and tells whether it is alive. `lag(lake)` compares the input tables' latest versions
with the positions recorded in the unified table's last ETL commit.

The state directory is `$DELTABUS_SERVICE_DIR`, else `$DAGSTER_HOME/../deltabus-service`
when DAGSTER_HOME is set, else `.deltabus/service` in the working directory.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import deltabus
from deltabus.apps.timezones.etl.command import etl_command
from deltabus.apps.timezones.layout import read_layout
from deltabus.core.processes import apply_process_defaults, stop_pid
from deltabus.core.processes import process_alive as alive
from deltabus.delta.lake import Lake
from deltabus.delta.tables import find_commit, meta

SERVICE_DIR_VAR = "DELTABUS_SERVICE_DIR"
DATA_OPERATIONS = ("WRITE", "STREAMING UPDATE", "MERGE")

# Started by a throw-away intermediate process that exits at once, so the service is
# re-parented (never a zombie of a long-lived launcher) and outlives the launching run.
_SPAWN = """
import subprocess, sys
log = open(sys.argv[1], "ab", buffering=0)
p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                     start_new_session=True, close_fds=True)
print(p.pid, flush=True)
"""


def default_state_dir() -> Path:
    if os.environ.get(SERVICE_DIR_VAR):
        return Path(os.environ[SERVICE_DIR_VAR]).resolve()
    if os.environ.get("DAGSTER_HOME"):
        return (Path(os.environ["DAGSTER_HOME"]).resolve().parent / "deltabus-service").resolve()
    return Path(".deltabus/service").resolve()


@dataclass
class ServiceStatus:
    """What a caller needs to know about the service; holds no secret."""

    alive: bool
    enabled: bool
    pid: int | None
    started_at: float | None
    restarts: int
    state_dir: str
    log_file: str
    command: list[str] = field(default_factory=list)
    pids: list[int | None] = field(default_factory=list)  # one per ETL process

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class EtlService:
    """Start, watch and stop one continuous ETL process per state directory."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        self.state_dir = Path(state_dir).resolve() if state_dir else default_state_dir()
        self.pid_file = self.state_dir / "etl.pid"
        self.log_file = self.state_dir / "etl.log"
        self.state_file = self.state_dir / "service.json"
        self.ready_file = self.state_dir / "etl.ready"

    @property
    def ready_files(self) -> list[Path]:
        """Written by the process once its dataflow runs (`start(ready=True)`)."""
        return [self.ready_file]

    # -- state ------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, **updates: Any) -> dict[str, Any]:
        state = {**self._state(), **updates}
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)
        return state

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def status(self) -> ServiceStatus:
        state = self._state()
        pid = self.pid()
        return ServiceStatus(
            alive=pid is not None and process_alive(pid),
            enabled=bool(state.get("enabled", False)),
            pid=pid,
            started_at=state.get("started_at"),
            restarts=int(state.get("restarts", 0)),
            state_dir=str(self.state_dir),
            log_file=str(self.log_file),
            command=list(state.get("command", [])),
            pids=[pid],
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 16_384))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- control ----------------------------------------------------------------------

    @staticmethod
    def command(prefix: str | None = None, etl_args: Sequence[str] = ()) -> list[str]:
        return [*etl_command("continuous", prefix=prefix, as_json=False), *etl_args]

    def start(
        self,
        env: Mapping[str, str] | None = None,
        etl_args: Sequence[str] = (),
        prefix: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        ready: bool = False,
    ) -> ServiceStatus:
        """Start the service (a no-op when it is already alive) and mark it enabled.

        `env` (e.g. DELTABUS_* for the lake, with the secret) goes to the process only.
        With `ready`, the process writes `ready_file` once its dataflow runs.
        """
        current = self.status()
        if current.alive:
            self._save(enabled=True)
            return self.status()
        if ready:
            self.ready_file.unlink(missing_ok=True)
            etl_args = [*etl_args, "--ready-file", str(self.ready_file)]
        command = self.command(prefix, etl_args)
        self._save(enabled=True, command=command, restarts=0)
        self._launch(command, env, cwd)
        return self.status()

    def restart(
        self, env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
    ) -> ServiceStatus:
        """Relaunch the recorded command after the process died (enabled services only)."""
        state = self._state()
        if not state.get("enabled") or not state.get("command"):
            raise RuntimeError(f"the ETL service in {self.state_dir} was never started")
        if self.status().alive:
            return self.status()
        self._save(restarts=int(state.get("restarts", 0)) + 1)
        self._launch(state["command"], env, cwd)
        return self.status()

    def _launch(
        self,
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None,
    ) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting ETL service\n".encode())
        child_env = {**os.environ, **(env or {})}
        apply_process_defaults(child_env)
        spawner = subprocess.run(
            [sys.executable, "-c", _SPAWN, str(self.log_file), *command],
            env=child_env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        pid = int(spawner.stdout.strip().splitlines()[-1])
        self.pid_file.write_text(str(pid))
        self._save(started_at=time.time(), pid=pid)
        return pid

    def stop(self, timeout: float = 30.0) -> ServiceStatus:
        """Disable the service and stop its process (SIGTERM, then SIGKILL after `timeout`)."""
        self._save(enabled=False)
        pid = self.pid()
        if process_alive(pid):
            stop_pid(pid, timeout, "the ETL service")  # type: ignore[arg-type]
        return self.status()


class EtlServiceGroup:
    """N continuous ETL processes splitting the lake's partitions (process j of N, like
    the members of a consumer group), each an `EtlService` of its own in `p<j>/` under the
    state directory; seen from outside as one service."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, processes: int = 2):
        self.state_dir = Path(state_dir).resolve() if state_dir else default_state_dir()
        self.processes = processes
        self.members = [EtlService(self.state_dir / f"p{j}") for j in range(processes)]
        self.log_file = self.members[0].log_file

    @property
    def ready_files(self) -> list[Path]:
        return [m.ready_file for m in self.members]

    def pid(self) -> int | None:
        return self.members[0].pid()

    def status(self) -> ServiceStatus:
        each = [m.status() for m in self.members]
        return ServiceStatus(
            alive=all(s.alive for s in each),
            enabled=all(s.enabled for s in each),
            pid=each[0].pid,
            started_at=min((s.started_at for s in each if s.started_at), default=None),
            restarts=sum(s.restarts for s in each),
            state_dir=str(self.state_dir),
            log_file=str(self.log_file),
            command=each[0].command,
            pids=[s.pid for s in each],
        )

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(
            f"[process {j}] {line}"
            for j, m in enumerate(self.members)
            for line in m.log_tail(lines).splitlines()
        )

    def start(
        self,
        env: Mapping[str, str] | None = None,
        etl_args: Sequence[str] = (),
        prefix: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        ready: bool = False,
    ) -> ServiceStatus:
        n = str(self.processes)
        for j, member in enumerate(self.members):
            args = [*etl_args, "--process", str(j), "--processes", n]
            member.start(env, args, prefix, cwd, ready)
        return self.status()

    def restart(
        self, env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
    ) -> ServiceStatus:
        """Relaunch the processes that died; the others keep running."""
        for member in self.members:
            if not member.status().alive:
                member.restart(env, cwd)
        return self.status()

    def stop(self, timeout: float = 30.0) -> ServiceStatus:
        for member in self.members:
            member.stop(timeout)
        return self.status()


def process_alive(pid: int | None) -> bool:
    """True while `pid` is a running (not zombie) `deltabus etl` process."""
    return alive(pid, "deltabus", "etl")


def other_live_etl(lake: Lake, service_pids: int | Sequence[int | None] | None) -> str | None:
    """Describes an ETL holding the unified table (or a partition of it) that is not the
    service and may run.

    The service's sensor relaunches a dead service, but not when another ETL fenced it
    and still runs (on another host, whether it runs cannot be told: assume it does).
    """
    bus = deltabus.Bus(lake)
    ours = {service_pids} if isinstance(service_pids, int) else set(service_pids or ())
    for table in read_layout(lake).unified_tables:
        holder = bus.output_holder(table)
        if holder is None or holder["alive"] is False:
            continue
        owner = holder["owner"] or {}
        if owner.get("pid") in ours and owner.get("host") == socket.gethostname():
            continue  # the service's own epoch: it died, relaunch it
        return f"{table} epoch {holder['epoch']}: {holder['described']}"
    return None


# -- lag ------------------------------------------------------------------------------


def recorded_positions(lake: Lake) -> tuple[dict[str, int], dict[str, Any] | None]:
    """Input versions the ETL has covered (as the ETL itself reads them; per input
    partition table when the lake is partitioned), and its newest commit."""
    from deltabus.apps.timezones.etl.positions import recorded_positions as etl_positions

    layout = read_layout(lake)
    positions: dict[str, int] = dict.fromkeys(layout.input_tables, -1)
    newest: dict[str, Any] | None = None
    for i, table in enumerate(layout.unified_tables):
        if not lake.exists(table):
            continue
        dt = lake.open(table)
        found, _ = etl_positions(dt, layout.inputs_of(i))
        positions.update(found)
        last = find_commit(dt, lambda c: meta(c, "etl.seq") is not None, limit=200)
        if last and (newest is None or last.get("timestamp", 0) > newest.get("timestamp", 0)):
            newest = last
    return positions, newest


def lag(lake: Lake, now: float | None = None) -> dict[str, Any]:
    """How far the unified table is behind the inputs.

    Per input table: its latest version, the version the ETL has covered, how many data
    commits (appends; compaction and vacuum commits carry no rows) lie after it, and the
    age of the oldest of them in seconds. `max_lag_s` is the largest such age.
    """
    now = time.time() if now is None else now
    positions, last_etl = recorded_positions(lake)
    layout = read_layout(lake)
    tables: dict[str, dict[str, Any]] = {}
    for table in layout.input_tables:  # per partition when the lake is partitioned
        if not lake.exists(table):
            continue
        dt = lake.open(table)
        latest = dt.version()
        done = positions.get(table, -1)
        pending: list[dict[str, Any]] = []
        if latest > done:
            history = dt.history(limit=min(latest - done, 1000))
            pending = [
                h
                for h in history
                if h.get("version", -1) > done and h.get("operation") in DATA_OPERATIONS
            ]
        oldest = min((h["timestamp"] for h in pending), default=None)
        tables[table] = {
            "latest_version": latest,
            "processed_version": done,
            "versions_behind": max(0, latest - done),
            "data_commits_behind": len(pending),
            "lag_s": round(max(0.0, now - oldest / 1000), 3) if oldest else 0.0,
        }
    versions = {t: lake.open(t).version() for t in layout.unified_tables if lake.exists(t)}
    return {
        "tables": tables,
        "partitions": layout.partitions,
        "unified_versions": versions,
        # One number that moves whenever the output commits: the table's version, or the
        # sum over its partitions.
        "unified_version": sum(versions.values()) if versions else None,
        "last_etl_commit_age_s": round(max(0.0, now - last_etl["timestamp"] / 1000), 3)
        if last_etl and last_etl.get("timestamp")
        else None,
        "data_commits_behind": sum(t["data_commits_behind"] for t in tables.values()),
        "max_lag_s": max((t["lag_s"] for t in tables.values()), default=0.0),
    }
