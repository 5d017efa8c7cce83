"""Health endpoints for process probes (Kubernetes liveness and readiness).

A process started with a health port (`deltabus --health-port N`, or DELTABUS_HEALTH_PORT)
answers on `0.0.0.0:N`:

- `GET /healthz`: 200 `ok` while the process runs (the server lives in a daemon thread of
  the process, so it stops answering when the process ends or hangs in native code that
  holds the interpreter).
- `GET /readyz`: 503 `starting` until the component calls `mark_ready()` (connected to the
  lake, its loop or dataflow running), then 200 `ready`.

Any other path is 404. The server is the standard library's ThreadingHTTPServer; further
read-only endpoints (e.g. metrics) are added with `HealthServer.add_route`. Nothing is
served unless a port is given.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from deltabus.core.errors import ConfigError

log = logging.getLogger(__name__)

# (status, content type, body) of one GET.
Answer = tuple[int, str, bytes]
Route = Callable[[], Answer]
TEXT = "text/plain; charset=utf-8"
HEALTH_PORT_VAR = "DELTABUS_HEALTH_PORT"

_ready = threading.Event()
_server: HealthServer | None = None
_server_lock = threading.Lock()


def mark_ready() -> None:
    """Report this process ready: `/readyz` answers 200 from now on. Idempotent, and a
    no-op in effect when no health server runs."""
    if not _ready.is_set():
        _ready.set()
        if _server is not None:
            log.info("ready (health endpoint on port %d)", _server.port)


def is_ready() -> bool:
    return _ready.is_set()


def _healthz() -> Answer:
    return 200, TEXT, b"ok\n"


def _readyz() -> Answer:
    return (200, TEXT, b"ready\n") if _ready.is_set() else (503, TEXT, b"starting\n")


class HealthServer:
    """An HTTP server on its own daemon thread answering GETs from a table of routes.

    Starts listening in the constructor (raises ConfigError when the port cannot be
    bound) and serves until `close()` or the end of the process. `port` is the bound
    port (useful with port 0).
    """

    def __init__(self, port: int, host: str = "0.0.0.0") -> None:
        self.routes: dict[str, Route] = {"/healthz": _healthz, "/readyz": _readyz}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                route = routes.get(self.path.split("?", 1)[0])
                status, content_type, body = (
                    route() if route is not None else (404, TEXT, b"not found\n")
                )
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # probes every few seconds would drown the process's own log

        try:
            self._httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve the health endpoint on {host}:{port}: {exc.strerror or exc}",
                f"choose a free port with --health-port or {HEALTH_PORT_VAR}",
            ) from None
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="deltabus-health", daemon=True
        )
        self._thread.start()

    def add_route(self, path: str, route: Route) -> None:
        """Answer GET `path` (e.g. "/metrics") with what `route()` returns."""
        self.routes[path] = route

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def serve(port: int, host: str = "0.0.0.0") -> HealthServer:
    """Start this process's health server on `port` (once; a second call with the same
    port returns the running server).

    Raises:
        ConfigError: the port is outside 1..65535, cannot be bound, or differs from the
            port the running server already listens on.
    """
    global _server
    if not 1 <= port <= 65535:
        raise ConfigError(
            f"health port {port} is not a TCP port",
            f"give --health-port or {HEALTH_PORT_VAR} a number from 1 to 65535",
        )
    with _server_lock:
        if _server is None:
            _server = HealthServer(port, host)
            log.debug("health endpoint on %s:%d (/healthz, /readyz)", host, _server.port)
        elif _server.port != port:
            raise ConfigError(
                f"the health endpoint already runs on port {_server.port}, not {port}",
                f"give one port: --health-port wins over {HEALTH_PORT_VAR}",
            )
        return _server


def running() -> HealthServer | None:
    """This process's health server, if one was started."""
    return _server
