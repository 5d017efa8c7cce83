"""Where a benchmark runs: the lake connection for child processes, a throwaway MinIO,
a description of the machine, and CPU accounting per process."""

from __future__ import annotations

import logging
import os
import platform as _platform  # the standard library module (never a local package)
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil

from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)


def minio_configured(settings: Settings) -> bool:
    """True when the settings name a MinIO we can log in to (a secret key is set)."""
    return settings.storage == "minio" and settings.secret_key is not None


@contextmanager
def throwaway_minio(
    bucket: str = "deltabus-bench", notify: bool = False
) -> Iterator[tuple[Settings, dict[str, int]]]:
    """A MinIO on a free loopback port with a temporary data directory (removed after);
    yields its settings and the pids to account CPU to ("minio", and "relay" with
    `notify`: a `deltabus notify relay` process MinIO's webhook target posts commits to)."""
    from deltabus.adapters.dev.minio_process import MinioServer
    from deltabus.bus.notify_relay import subscribe

    with tempfile.TemporaryDirectory(prefix="deltabus-bench-minio-") as tmp, ExitStack() as stack:
        relay_url = None
        pids: dict[str, int] = {}
        if notify:
            relay_url, pids["relay"] = stack.enter_context(_relay_process(Path(tmp)))
        server = MinioServer(
            Path(tmp) / "data",
            access_key="bench-" + secrets.token_hex(4),
            secret_key=secrets.token_urlsafe(18),
            public_metrics=True,
            webhook=f"{relay_url}/minio" if relay_url else None,
        )
        server.start()
        stack.callback(server.stop)
        settings = Settings(
            storage="minio",
            minio_endpoint=server.endpoint,
            access_key=server.access_key,
            secret_key=server.secret_key,
            bucket=bucket,
            prefix="lake",
            notify=notify,
            notify_url=f"{relay_url}/events" if relay_url else None,
        )
        Lake(settings).init_bucket()
        if notify:
            from deltabus.bus.notify import close_all

            subscribe(Lake(settings))
            stack.callback(close_all)  # this process's tails read the relay: close them first
        log.info("throwaway MinIO on %s (data in %s)", server.endpoint, tmp)
        assert server.process is not None
        pids["minio"] = server.process.pid
        yield settings, pids


@contextmanager
def _relay_process(tmp: Path) -> Iterator[tuple[str, int]]:
    """`deltabus notify relay` on a free loopback port, as its own process (its CPU is a
    component of its own); (its URL, its pid)."""
    import subprocess

    from deltabus.adapters.dev.relay_process import start_relay_process
    from deltabus.core.net import free_port

    url, proc = start_relay_process(free_port(), tmp / "relay.log")
    try:
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_model() -> str:
    """The CPU's model name (`lscpu`'s), or "unknown CPU"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def source_commit() -> str | None:
    """The short commit of the code measured, with "+dirty" when the working tree differs
    from it; None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def provenance(at_s: float | None = None) -> dict[str, str | None]:
    """{date, commit, cpu} of a report: `date` is `at_s` (epoch s; None: now) as
    "YYYY-MM-DD HH:MM UTC", `commit` `source_commit()`, `cpu` `cpu_model()`."""
    from datetime import UTC, datetime

    when = datetime.now(UTC) if at_s is None else datetime.fromtimestamp(at_s, UTC)
    return {
        "date": when.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": source_commit(),
        "cpu": cpu_model(),
    }


def machine_description() -> str:
    """CPU model and count, memory, kernel, Python: enough to compare figures across hosts."""
    model = cpu_model()
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB RAM"
                break
    except OSError:
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load average {os.getloadavg()[0]:.2f} at start"
    return (
        f"{os.cpu_count()} cores ({model}){mem}, {_platform.system()} {_platform.release()}, "
        f"Python {sys.version.split()[0]}{load}"
    )


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of `pid` so far (None when it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return times.user + times.system


def process_tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of `pid`, its children that ended (reaped) and those still running:
    a server that forks a process per connection (PostgreSQL) as one component."""
    try:
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        children = proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    for child in children:
        try:
            c = child.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += c.user + c.system
    return total


def machine_busy() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of all CPUs since boot (idle and I/O wait are not busy)."""
    times = psutil.cpu_times()
    total = sum(times)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


# What the machine's CPUs did besides running processes, sampled every second: on a
# virtual machine a stall that shows in every stage at once, the producer's included, is
# the hypervisor running someone else (steal) or the disk not answering (I/O wait, e.g.
# MinIO's synced writes), and the worst second says so where the run's average hides it.
STALL_KINDS = ("steal", "iowait")


def machine_stall_s() -> dict[str, float]:
    """CPU seconds of all CPUs since boot spent stolen and waiting for I/O (0 where the
    kernel does not report one)."""
    times = psutil.cpu_times()
    return {kind: float(getattr(times, kind, 0.0)) for kind in STALL_KINDS}


class StallSampler:
    """`machine_stall_s` once a second, in a thread: the worst second of each kind."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.worst_pct = dict.fromkeys(STALL_KINDS, 0.0)  # % of all cores, worst interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        cores = psutil.cpu_count() or 1
        last_t, last = time.monotonic(), machine_stall_s()
        while not self._stop.wait(self.every_s):
            now_t, now = time.monotonic(), machine_stall_s()
            span = max(1e-9, (now_t - last_t) * cores)
            for kind in STALL_KINDS:
                pct = 100 * (now[kind] - last[kind]) / span
                self.worst_pct[kind] = max(self.worst_pct[kind], pct)
            last_t, last = now_t, now


class CpuMeter:
    """CPU used by named processes (and the whole machine) between start() and stop().

    Reported as % of one core, so 100 means one core fully used.
    """

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.trees: set[str] = set()  # names measured with their child processes
        self._start: dict[str, float] = {}
        self._end: dict[str, float] = {}
        self._t0 = self._t1 = 0.0
        self._m0: tuple[float, float] | None = None
        self._m1: tuple[float, float] | None = None
        self._stall0 = self._stall1 = dict.fromkeys(STALL_KINDS, 0.0)
        self._stalls = StallSampler()

    def watch(self, name: str, pid: int | None, tree: bool = False) -> None:
        if pid is None:
            return
        self.pids[name] = pid
        if tree:
            self.trees.add(name)
        if self._t0:  # started already: measure from now on
            self._start[name] = self._cpu_s(name, pid) or 0.0

    def _cpu_s(self, name: str, pid: int) -> float | None:
        return process_tree_cpu_s(pid) if name in self.trees else process_cpu_s(pid)

    def sample(self, name: str) -> None:
        """Record a process's CPU now (call before it exits)."""
        value = self._cpu_s(name, self.pids[name]) if name in self.pids else None
        if value is not None:
            self._end[name] = value

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._m0 = machine_busy()
        self._stall0 = machine_stall_s()
        self._stalls.start()
        for name, pid in self.pids.items():
            self._start[name] = self._cpu_s(name, pid) or 0.0

    def stop(self) -> None:
        self._t1 = time.monotonic()
        self._m1 = machine_busy()
        self._stall1 = machine_stall_s()
        self._stalls.stop()
        for name in self.pids:
            self.sample(name)

    def report(self) -> dict[str, float]:
        wall = max(1e-9, self._t1 - self._t0)
        out = {
            name: round(100 * (self._end[name] - self._start.get(name, 0.0)) / wall, 1)
            for name in self.pids
            if name in self._end
        }
        if self._m0 and self._m1 and self._m1[1] > self._m0[1]:
            busy = (self._m1[0] - self._m0[0]) / (self._m1[1] - self._m0[1])
            out["machine_busy_pct_of_all_cores"] = round(100 * busy, 1)
            for kind in STALL_KINDS:
                part = (self._stall1[kind] - self._stall0[kind]) / (self._m1[1] - self._m0[1])
                out[f"machine_{kind}_pct_of_all_cores"] = round(100 * part, 1)
                worst = self._stalls.worst_pct[kind]
                out[f"machine_{kind}_worst_second_pct"] = round(worst, 1)
        return out
