"""`deltabus minio up/down`: a persistent local MinIO for development and the demo."""

from __future__ import annotations

import os
import secrets
import signal
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from deltabus.errors import ConfigError
from deltabus.lake import Lake
from deltabus.local_minio import MinioServer, build_minio
from deltabus.settings import Settings, load_settings

LOCAL_HOSTS = ("127.0.0.1", "localhost")


def _ensure_secret(env_file: Path | None) -> Path | None:
    """Write a random secret key into the .env file when none is configured yet."""
    settings = load_settings(env_file)
    if settings.secret_key is not None:
        return None
    path = Path(env_file or os.environ.get("DELTABUS_ENV_FILE") or ".env")
    lines = [
        "# written by `deltabus minio up`: credentials of the local development MinIO",
        f"DELTABUS_ACCESS_KEY={settings.access_key}",
        f"DELTABUS_SECRET_KEY={secrets.token_urlsafe(24)}",
    ]
    with path.open("a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def _alive(endpoint: str) -> bool:
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


def minio_up(env_file: Path | None, data_dir: Path) -> str:
    local = local_minio_settings(env_file)
    if local is None:
        return LOCAL_LAKE
    settings, port, notes = local
    if _alive(settings.minio_endpoint):
        notes.append(f"MinIO already running at {settings.minio_endpoint}")
    else:
        server = MinioServer(
            data_dir.resolve() / "data",
            settings.access_key,
            settings.secret_key.get_secret_value(),  # type: ignore[union-attr]
            port=port,
            binary=build_minio(),
        )
        server.start()
        (data_dir / "minio.pid").write_text(str(server.process.pid))  # type: ignore[union-attr]
        notes.append(f"MinIO started at {server.endpoint} (pid {server.process.pid})")  # type: ignore[union-attr]
    lake = Lake(settings)
    created = lake.init_bucket()
    lake.check(write=True)
    notes.append(f"bucket '{settings.bucket}' {'created' if created else 'ready'}")
    return "; ".join(notes)


def minio_down(data_dir: Path) -> str:
    pid_file = data_dir / "minio.pid"
    if not pid_file.exists():
        return f"no MinIO started from {data_dir}"
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    pid_file.unlink()
    return f"stopped MinIO (pid {pid})"
