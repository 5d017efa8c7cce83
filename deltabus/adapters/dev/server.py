"""`deltabus minio up/down`: a persistent local MinIO for development and the demo, with
(`--notify`) a relay its commit events are pushed to."""

from __future__ import annotations

import os
import secrets
import signal
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from deltabus.adapters.dev.minio_process import MinioServer, build_minio
from deltabus.core.errors import ConfigError, StorageError
from deltabus.core.settings import Settings, append_env_file, load_settings
from deltabus.delta.lake import Lake

LOCAL_HOSTS = ("127.0.0.1", "localhost")
RELAY_PORT = 9100


def _ensure_secret(env_file: Path | None) -> Path | None:
    """Write a random secret key into the .env file when none is configured yet."""
    settings = load_settings(env_file)
    if settings.secret_key is not None:
        return None
    return append_env_file(
        env_file,
        [
            "# written by `deltabus minio up`: credentials of the local development MinIO",
            f"DELTABUS_ACCESS_KEY={settings.access_key}",
            f"DELTABUS_SECRET_KEY={secrets.token_urlsafe(24)}",
        ],
    )


def minio_alive(endpoint: str) -> bool:
    """True when a MinIO answers its liveness probe at `endpoint` within a second."""
    try:
        with urllib.request.urlopen(f"{endpoint}/minio/health/live", timeout=1):
            return True
    except OSError:
        return False


LOCAL_LAKE = "DELTABUS_STORAGE=local: the lake is a local directory, no MinIO needed"


def local_minio_settings(env_file: Path | None) -> tuple[Settings, int, list[str]] | None:
    """Settings for a development MinIO on loopback, with credentials ensured in `env_file`:
    (settings, the endpoint's port, notes for the user); None for a local-directory lake.

    Raises `ConfigError` when the endpoint is not a local http://127.0.0.1:PORT.
    """
    settings = load_settings(env_file)
    if settings.storage == "local":
        return None
    url = urlparse(settings.minio_endpoint)
    if url.hostname not in LOCAL_HOSTS or url.scheme != "http" or not url.port:
        raise ConfigError(
            f"DELTABUS_MINIO_ENDPOINT={settings.minio_endpoint} is not a local http://127.0.0.1:PORT",
            "point it at a loopback port, or run your own MinIO and use `deltabus init-bucket`",
        )
    written = _ensure_secret(env_file)
    notes = [f"wrote new credentials to {written}"] if written else []
    return load_settings(env_file), url.port, notes


def minio_up(
    env_file: Path | None, data_dir: Path, notify: bool = False, relay_port: int = RELAY_PORT
) -> str:
    """Start MinIO (unless it runs), create the bucket; with `notify`, first a relay on
    `relay_port` that MinIO's webhook target pushes commit events to, then subscribe the
    lake to it and point the tails at it in the .env file."""
    local = local_minio_settings(env_file)
    if local is None:
        return LOCAL_LAKE
    settings, port, notes = local
    data_dir.mkdir(parents=True, exist_ok=True)
    relay_url = _relay_up(data_dir, relay_port, notes) if notify else None
    foreign = False  # a MinIO this data directory did not start holds the endpoint
    if minio_alive(settings.minio_endpoint):
        notes.append(f"MinIO already running at {settings.minio_endpoint}")
        foreign = not (data_dir / "minio.pid").exists()
    else:
        server = MinioServer(
            data_dir.resolve() / "data",
            settings.access_key,
            settings.secret_key.get_secret_value(),  # type: ignore[union-attr]
            port=port,
            binary=build_minio(),
            webhook=f"{relay_url}/minio" if relay_url else None,
        )
        server.start()
        (data_dir / "minio.pid").write_text(str(server.process.pid))  # type: ignore[union-attr]
        notes.append(f"MinIO started at {server.endpoint} (pid {server.process.pid})")  # type: ignore[union-attr]
    lake = Lake(settings)
    try:
        created = lake.init_bucket()
        lake.check(write=True)
    except StorageError as exc:
        if foreign:
            exc.hint = (
                f"a MinIO not started from {data_dir} answers at {settings.minio_endpoint} "
                "(another checkout's `deltabus minio up`?): run `deltabus minio down` "
                "there, or set DELTABUS_MINIO_ENDPOINT to a free port; or " + (exc.hint or "")
            )
        raise
    notes.append(f"bucket '{settings.bucket}' {'created' if created else 'ready'}")
    if relay_url:
        from deltabus.bus.notify_relay import subscribe

        try:
            subscribe(lake)
        except StorageError as exc:  # a MinIO that was already running without the target
            exc.hint = (
                "`deltabus minio down`, then `deltabus minio up --notify` (MinIO reads its "
                "webhook target at start); or " + (exc.hint or "")
            )
            raise
        notes.append(f"commit events of '{settings.bucket}' go to the relay")
        notes.extend(_point_tails_at(env_file, settings, f"{relay_url}/events"))
    return "; ".join(notes)


def _relay_up(data_dir: Path, port: int, notes: list[str]) -> str:
    """The relay's URL: the one already answering on `port`, or one started now."""
    from deltabus.adapters.dev.relay_process import start_relay_process
    from deltabus.core.net import http_get

    url = f"http://127.0.0.1:{port}"
    if http_get(f"{url}/ready", timeout=1)[0] is not None:
        notes.append(f"notify relay already running at {url}")
        return url
    url, proc = start_relay_process(port, data_dir / "relay.log")
    (data_dir / "relay.pid").write_text(str(proc.pid))
    notes.append(f"notify relay started at {url} (pid {proc.pid})")
    return url


def _point_tails_at(env_file: Path | None, settings: Settings, events_url: str) -> list[str]:
    """Turn notifications on in the .env file, unless the settings already say where."""
    if settings.notify and settings.notify_url == events_url:
        return []
    if settings.notify_url not in (None, events_url):
        return [
            f"DELTABUS_NOTIFY_URL is already {settings.notify_url}; left as it is "
            f"(this relay streams at {events_url})"
        ]
    path = append_env_file(
        env_file,
        [
            "# written by `deltabus minio up --notify`: tails wait on the relay's commit events",
            "DELTABUS_NOTIFY=true",
            f"DELTABUS_NOTIFY_URL={events_url}",
        ],
    )
    return [f"wrote DELTABUS_NOTIFY and DELTABUS_NOTIFY_URL to {path}"]


def _stop(pid_file: Path, what: str) -> str | None:
    """SIGTERM the process in `pid_file` and remove the file; None when there is none."""
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    pid_file.unlink()
    return f"stopped {what} (pid {pid})"


def minio_down(data_dir: Path) -> str:
    minio = _stop(data_dir / "minio.pid", "MinIO")
    relay = _stop(data_dir / "relay.pid", "the notify relay")
    if minio is None and relay is None:
        return f"no MinIO started from {data_dir}"
    return "; ".join(x for x in (minio, relay) if x)
