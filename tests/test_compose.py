"""docker-compose.yml: renders with the required variables set, refuses to render without
its secrets, publishes ports on loopback only and hard-codes no secret.

The rendering tests need the `docker-compose` client (no Docker engine): they are skipped
when it is missing, except under CI (CI=true), where they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"

REQUIRED_ENV = {
    "MINIO_S3_ACCESS_KEY": "deltabus-test",
    "MINIO_S3_SECRET_ACCESS_KEY": "deltabus-test-secret",
    "DAGSTER_POSTGRES_PASSWORD": "deltabus-test-pg",
}
OPTIONAL_ENV = {
    "DAGSTER_POSTGRES_USER": "dagster",
    "DAGSTER_POSTGRES_DB": "dagster",
    "DELTABUS_BUCKET": "deltabus",
}


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        msg = "docker-compose is not on PATH (Debian package: docker-compose)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def _run_config(env_vars: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return _run_compose(env_vars, tmp_path, "config", "-q")


def _run_compose(
    env_vars: dict[str, str], tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    # A clean environment plus an empty env file, so neither the caller's shell nor a
    # developer's .env in the repo root can supply (or mask) a variable.
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    env.update(env_vars)
    return subprocess.run(
        [_docker_compose(), "--env-file", str(env_file), "-f", str(COMPOSE_FILE), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_config_renders_with_required_env(tmp_path: Path) -> None:
    result = _run_config({**REQUIRED_ENV, **OPTIONAL_ENV}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_config_renders_with_only_required_env(tmp_path: Path) -> None:
    result = _run_config(dict(REQUIRED_ENV), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_config_fails_without_minio_secret(tmp_path: Path) -> None:
    env_vars = {k: v for k, v in REQUIRED_ENV.items() if k != "MINIO_S3_SECRET_ACCESS_KEY"}
    result = _run_config(env_vars, tmp_path)
    assert result.returncode != 0, "compose rendered without MINIO_S3_SECRET_ACCESS_KEY"
    assert "MINIO_S3_SECRET_ACCESS_KEY" in result.stdout + result.stderr


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _published_host_ips(port: object) -> str | None:
    """Host IP of one `ports` entry (short or long syntax); None if it publishes nothing."""
    if isinstance(port, dict):
        return port.get("host_ip", "") if "published" in port else None
    text = str(port)
    # short syntax: [HOST_IP:][HOST_PORT:]CONTAINER_PORT[/PROTO]; ${...} may hold colons
    text = re.sub(r"\$\{[^}]*\}", "VAR", text)
    parts = text.split(":")
    if len(parts) == 3:
        return parts[0]
    return ""  # "8080:80" or "80": published on every interface


def test_published_ports_bound_to_loopback() -> None:
    services = _compose()["services"]
    checked = 0
    for name, svc in services.items():
        assert svc.get("network_mode") != "host", f"{name} uses the host network"
        for port in svc.get("ports") or []:
            host_ip = _published_host_ips(port)
            if host_ip is None:
                continue
            checked += 1
            assert host_ip == "127.0.0.1", f"service {name} publishes {port!r} beyond 127.0.0.1"
    assert checked >= 3  # MinIO API + console, Dagster webserver


def test_no_hard_coded_secrets() -> None:
    secret_names = re.compile(r"(SECRET|PASSWORD|ROOT_USER|ACCESS_KEY)", re.I)
    for name, svc in _compose()["services"].items():
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
        for key, value in env.items():
            if value is None or not secret_names.search(key):
                continue
            assert re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]*\}", str(value)), (
                f"service {name}: {key} must come from a required variable, got {value!r}"
            )


DISTRIBUTED_MINIO = ["minio1", "minio2", "minio3", "minio4"]


def test_distributed_profile_renders_four_minio_nodes(tmp_path: Path) -> None:
    result = _run_compose(dict(REQUIRED_ENV), tmp_path, "--profile", "distributed", "config")
    assert result.returncode == 0, result.stdout + result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name in DISTRIBUTED_MINIO:
        svc = services[name]
        assert svc["command"].startswith("server http://minio{1...4}/data{1...2}"), name
        targets = sorted(str(v).split(":")[1] for v in svc["volumes"])
        assert targets == ["/data1", "/data2"], (name, svc["volumes"])
        assert svc["environment"]["MINIO_ROOT_USER"] == REQUIRED_ENV["MINIO_S3_ACCESS_KEY"]
    assert "minio-dist-init" in services
    listed = _run_compose(
        dict(REQUIRED_ENV), tmp_path, "--profile", "distributed", "config", "--services"
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert set(DISTRIBUTED_MINIO) <= set(listed.stdout.split())


def test_distributed_profile_leaves_the_default_stack_alone() -> None:
    services = _compose()["services"]
    profiled = {name for name, svc in services.items() if svc.get("profiles")}
    assert profiled == {*DISTRIBUTED_MINIO, "minio-dist-init"}
    assert all(services[name]["profiles"] == ["distributed"] for name in profiled)
    for name, svc in services.items():
        if name not in profiled:
            assert not set(svc.get("depends_on") or {}) & profiled, name
    assert "minio" in services and "minio-init" in services
