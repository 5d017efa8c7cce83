"""A real MinIO server (or a distributed cluster) on loopback, for tests, demos and
benchmarks on one machine.

The binary is built once with `go install` at a pinned version and cached; servers
bind 127.0.0.1 so nothing started here is reachable from the network, unless a caller
gives a cluster the addresses of hosts it made itself (the network namespaces of
tests/netns.py).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from deltabus.core.errors import DeltabusError
from deltabus.core.net import free_port, free_ports, http_get
from deltabus.core.processes import spawn

log = logging.getLogger(__name__)

MINIO_MODULE = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"


def cache_dir() -> Path:
    return Path(os.environ.get("DELTABUS_CACHE", Path.home() / ".cache" / "deltabus"))


def find_minio() -> Path | None:
    """`$DELTABUS_MINIO_BIN`, then the build cache, then `minio` on PATH."""
    explicit = os.environ.get("DELTABUS_MINIO_BIN")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    cached = cache_dir() / "bin" / "minio"
    if cached.is_file():
        return cached
    on_path = shutil.which("minio")
    return Path(on_path) if on_path else None


def build_minio() -> Path:
    """Build MinIO with `go install` into the cache (several minutes the first time)."""
    found = find_minio()
    if found:
        return found
    go = shutil.which("go")
    if go is None:
        raise DeltabusError(
            "MinIO is not installed and Go is not available to build it",
            "install Go, or set DELTABUS_MINIO_BIN to a minio binary",
        )
    target = cache_dir() / "bin"
    target.mkdir(parents=True, exist_ok=True)
    log.info("building MinIO (%s) into %s; this takes a few minutes once", MINIO_MODULE, target)
    env = {**os.environ, "GOBIN": str(target), "CGO_ENABLED": "0"}
    subprocess.run([go, "install", MINIO_MODULE], check=True, env=env)
    return target / "minio"


class MinioServer:
    """One MinIO process with its own data directory, bound to 127.0.0.1."""

    def __init__(
        self,
        data_dir: Path,
        access_key: str,
        secret_key: str,
        port: int | None = None,
        binary: Path | None = None,
        public_metrics: bool = False,
        webhook: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        # Where MinIO's webhook target DELTABUS posts bucket events (deltabus.bus.notify_relay).
        self.webhook = webhook
        self.access_key = access_key
        self.secret_key = secret_key
        self.port = port or free_port()
        self.binary = binary or build_minio()
        # Serve /minio/v2/metrics without auth (request counts for the benchmark's cost).
        self.public_metrics = public_metrics
        self.process: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"minio-{self.port}.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> MinioServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            "MINIO_CALLHOME_ENABLE": "off",
        }
        if self.public_metrics:
            env["MINIO_PROMETHEUS_AUTH_TYPE"] = "public"
        if self.webhook:
            env["MINIO_NOTIFY_WEBHOOK_ENABLE_DELTABUS"] = "on"
            env["MINIO_NOTIFY_WEBHOOK_ENDPOINT_DELTABUS"] = self.webhook
        self.process = spawn(
            [
                str(self.binary),
                "server",
                str(self.data_dir),
                "--address",
                f"127.0.0.1:{self.port}",
                "--quiet",
            ],
            self.log_path,
            env=env,
        )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise DeltabusError(
                    f"MinIO exited with status {self.process.returncode}",
                    f"see {self.log_path}",
                )
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise DeltabusError(f"MinIO did not become ready within {timeout}s", f"see {self.log_path}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# MinIO's documented minimum for a distributed deployment. With 2 drives a node, 4 nodes
# make one erasure set of 8 drives at EC:4: one node down keeps reads and writes.
MIN_CLUSTER_NODES = 4
MAX_CLUSTER_NODES = 16
# The drive paths go into http:// URLs, so they must need no escaping.
_URL_SAFE_PATH = re.compile(r"/[A-Za-z0-9._/+=-]*")


class MinioCluster:
    """Distributed, erasure-coded MinIO on loopback: `nodes` processes, `drives` dirs each.

    Every process gets the same explicit list of drive URLs, which makes one server pool
    striped over all nodes. (Each argument with `{1...n}` ellipses would be a pool of its
    own, so per-node ellipses would not spread an object over the nodes.) MINIO_CI_CD lets
    MinIO use drives on the root disk and keeps each process's buffer pool small.
    Clients take one endpoint: use a node that is never stopped (a real deployment puts a
    load balancer in front).

    By default every node binds 127.0.0.1 on a port of its own. `hosts` gives each node
    an address of its own instead (the nodes may then share a port), and `launch` the
    command prefix that starts node i where its address is, e.g. `ip netns exec NS`;
    the addresses must be ones the caller made, never the machine's real interfaces.
    """

    def __init__(
        self,
        root: Path,
        access_key: str,
        secret_key: str,
        nodes: int = MIN_CLUSTER_NODES,
        drives: int = 2,
        ports: list[int] | None = None,
        binary: Path | None = None,
        hosts: list[str] | None = None,
        launch: Callable[[int], list[str]] | None = None,
    ) -> None:
        if not MIN_CLUSTER_NODES <= nodes <= MAX_CLUSTER_NODES:
            raise DeltabusError(
                f"a distributed MinIO needs {MIN_CLUSTER_NODES} to {MAX_CLUSTER_NODES} nodes,"
                f" got {nodes}",
                "use 1 node for a single server",
            )
        if drives < 1:
            raise DeltabusError(f"each node needs at least one drive, got {drives}")
        self.root = Path(root).resolve()
        if not _URL_SAFE_PATH.fullmatch(str(self.root)):
            raise DeltabusError(
                f"MinIO drive path {self.root} does not fit in a URL",
                "use a data directory of letters, digits and ._-/ only",
            )
        self.ports = list(ports) if ports else free_ports(nodes)
        self.hosts = list(hosts) if hosts else ["127.0.0.1"] * nodes
        self.launch = launch
        listen = set(zip(self.hosts, self.ports, strict=False))
        if len(self.ports) != nodes or len(self.hosts) != nodes or len(listen) != nodes:
            raise DeltabusError(
                f"need {nodes} distinct addresses, got hosts {self.hosts} and ports {self.ports}"
            )
        self.access_key = access_key
        self.secret_key = secret_key
        self.drives = drives
        self.binary = binary or build_minio()
        self.processes: list[subprocess.Popen | None] = [None] * nodes

    @property
    def nodes(self) -> int:
        return len(self.ports)

    def node_endpoint(self, node: int) -> str:
        return f"http://{self.hosts[node]}:{self.ports[node]}"

    @property
    def endpoint(self) -> str:
        """Node 0's endpoint: the one to give clients (never kill node 0 under them)."""
        return self.node_endpoint(0)

    def drive_dirs(self, node: int) -> list[Path]:
        return [self.root / f"n{node + 1}" / f"d{d + 1}" for d in range(self.drives)]

    def drive_urls(self) -> list[str]:
        return [
            f"{self.node_endpoint(n)}{path}"
            for n in range(self.nodes)
            for path in self.drive_dirs(n)
        ]

    def command(self, node: int) -> list[str]:
        """The exact command line of one node: its launch prefix, if any, then MinIO with
        the same drive list on every node."""
        address = f"{self.hosts[node]}:{self.ports[node]}"
        prefix = self.launch(node) if self.launch else []
        return [
            *prefix,
            str(self.binary),
            *("server", "--address", address, "--quiet", *self.drive_urls()),
        ]

    def log_path(self, node: int) -> Path:
        return self.root / f"minio-n{node + 1}.log"

    def _env(self, node: int) -> dict[str, str]:
        return {
            **os.environ,
            # In a container (/.dockerenv) MinIO waits for loopback endpoints to resolve
            # elsewhere; this names the endpoint host that is this node's own.
            "_MINIO_SERVER_LOCAL": f"{self.hosts[node]}:{self.ports[node]}",
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            "MINIO_CALLHOME_ENABLE": "off",
            "MINIO_CI_CD": "1",
        }

    def start_node(self, node: int) -> subprocess.Popen:
        """Start one node's process (it joins the others; no wait here)."""
        for path in self.drive_dirs(node):
            path.mkdir(parents=True, exist_ok=True)
        proc = spawn(self.command(node), self.log_path(node), env=self._env(node))
        self.processes[node] = proc
        return proc

    def start(self, timeout: float = 120) -> MinioCluster:
        for node in range(self.nodes):
            self.start_node(node)
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float = 120, node: int = 0) -> None:
        """Wait until `node` reports the cluster healthy: it has write quorum."""
        url = f"{self.node_endpoint(node)}/minio/health/cluster"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n, proc in enumerate(self.processes):
                if proc is not None and proc.poll() is not None:
                    raise DeltabusError(
                        f"MinIO node {n + 1} exited with status {proc.returncode}",
                        f"see {self.log_path(n)}",
                    )
            if http_get(url)[0] == 200:
                return
            time.sleep(0.2)
        raise DeltabusError(
            f"distributed MinIO was not healthy within {timeout}s", f"see {self.root}/*.log"
        )

    def health(self, node: int = 0) -> dict[str, int | None]:
        """`node`'s view of the cluster: HTTP status of the write and read health checks
        (200 or 503) and the write and read quorums (in drives) MinIO reports."""
        base = f"{self.node_endpoint(node)}/minio/health/cluster"
        write_status, write = http_get(base)
        read_status, read = http_get(f"{base}/read")

        def quorum(headers: dict[str, str], name: str) -> int | None:
            value = headers.get(name)
            return int(value) if value and value.isdigit() else None

        return {
            "write_status": write_status,
            "read_status": read_status,
            "write_quorum": quorum(write, "x-minio-write-quorum"),
            "read_quorum": quorum(read, "x-minio-read-quorum"),
        }

    def await_health(
        self, write_status: int, read_status: int | None = None, timeout: float = 30, node: int = 0
    ) -> dict[str, int | None]:
        """Poll `node`'s view until the write (and read) health checks give these statuses.

        A node's peers notice a crashed node within seconds, not at once: until then the
        health checks may still report the cluster as it was, so a single look can mislead.
        """
        deadline = time.monotonic() + timeout
        while True:
            health = self.health(node)
            if health["write_status"] == write_status and read_status in (
                None,
                health["read_status"],
            ):
                return health
            if time.monotonic() >= deadline:
                raise DeltabusError(
                    f"distributed MinIO did not report write {write_status}"
                    f" / read {read_status} within {timeout}s; last seen {health}",
                    f"see {self.root}/*.log",
                )
            time.sleep(0.25)

    def kill_node(self, node: int) -> None:
        """SIGKILL one node, as a crash or a power cut would stop it."""
        proc = self.processes[node]
        if proc is None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.processes[node] = None

    def restart_node(self, node: int, timeout: float = 120) -> None:
        """Start a stopped node again and wait until it serves the cluster itself."""
        self.start_node(node)
        self.wait_healthy(timeout, node=node)

    def stop(self) -> None:
        procs = [p for p in self.processes if p is not None]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.processes = [None] * self.nodes

    def __enter__(self) -> MinioCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
