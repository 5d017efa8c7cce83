"""A real MinIO server on loopback, for tests, demos and benchmarks on one machine.

The binary is built once with `go install` at a pinned version and cached; servers
always bind 127.0.0.1 so nothing started here is reachable from the network.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from deltabus.errors import DeltabusError

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    ) -> None:
        self.data_dir = Path(data_dir)
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
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [
                str(self.binary),
                "server",
                str(self.data_dir),
                "--address",
                f"127.0.0.1:{self.port}",
                "--quiet",
            ],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
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
