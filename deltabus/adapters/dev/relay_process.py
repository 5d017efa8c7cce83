"""The notify relay (deltabus.bus.notify_relay) as a process of its own."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from subprocess import Popen

from deltabus.core.errors import ConfigError
from deltabus.core.net import http_get
from deltabus.core.processes import spawn


def start_relay_process(port: int, log_path: Path, timeout: float = 30) -> tuple[str, Popen]:
    """`deltabus notify relay` on 127.0.0.1:`port` as a process of its own session (it
    outlives the caller); returns (its URL, the process) once it answers.

    Raises `ConfigError` when it exits or does not answer in time (its log says why,
    e.g. the port is taken)."""
    proc = spawn(
        [sys.executable, "-m", "deltabus", "notify", "relay", "--port", str(port)], log_path
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while http_get(f"{url}/ready", timeout=1)[0] is None:  # any answer will do
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise ConfigError(
                f"the notify relay did not start on port {port}: see {log_path}",
                "free the port or choose another one",
            )
        time.sleep(0.1)
    return url, proc
