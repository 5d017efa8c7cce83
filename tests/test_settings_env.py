"""Settings cross process boundaries in one way (`Settings.to_env`), and lose nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from deltabus.apps.timezones.etl.command import etl_command
from deltabus.core.processes import child_env
from deltabus.core.settings import Settings, load_settings
from tests.conftest import clear_lake_env


def every_field_changed(tmp_path: Path) -> Settings:
    """Settings with no field at its default, so a field a copy forgets shows up."""
    changed = Settings(
        storage="local",
        local_root=tmp_path / "root",
        minio_endpoint="http://127.0.0.1:9123",
        access_key="someone",
        secret_key=SecretStr("s3cr3t-value"),
        session_token=SecretStr("t0ken-value"),
        profile="streaming",
        addressing_style="virtual",
        storage_options={"aws_server_side_encryption": "aws:kms"},
        bucket="another-bucket",
        region="eu-west-3",
        prefix="team/lake",
        log_retention_s=120,
        deleted_file_retention_s=3600,
        vacuum_deletes_per_s=250.5,
        unified_retention_s=86400,
        checkpoint_interval=7,
        retry_max_wait_s=42.5,
        skip_change_commits=True,
        on_corrupt_file="skip",
        hedge_reads=False,
        notify=True,
        notify_url="http://127.0.0.1:9100/events",
        idle_poll_ms=250,
        health_port=9464,
        metrics_port=9465,
    )
    defaults = Settings.model_construct()
    same = [f for f in Settings.model_fields if getattr(changed, f) == getattr(defaults, f)]
    assert not same, f"give these fields a non-default value in the test: {same}"
    return changed


def test_child_environment_reproduces_every_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    original = every_field_changed(tmp_path)
    env = child_env(original)
    assert env["DELTABUS_CHECKPOINT_INTERVAL"] == "7"  # bench children once lost it
    assert env["DELTABUS_REGION"] == "eu-west-3"  # test children once lost it
    clear_lake_env(monkeypatch)
    (tmp_path / ".env").write_text("DELTABUS_BUCKET=from-a-stray-dotenv\n")
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        if key.startswith("DELTABUS_"):
            monkeypatch.setenv(key, value)
    rebuilt = load_settings()  # exactly what a child process does
    # All but the health and metrics ports: one process's, a child would find them taken.
    assert "DELTABUS_HEALTH_PORT" not in env
    assert "DELTABUS_METRICS_PORT" not in env
    assert rebuilt == original.model_copy(update={"health_port": None, "metrics_port": None})


def test_serving_settings_come_from_the_same_file_and_cross_to_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serving stores are the serving layer's settings, read from the lake's `.env`
    file; the lake's settings do not carry them."""
    from deltabus.adapters.serving.settings import ServingSettings, load_serving_settings

    clear_lake_env(monkeypatch)
    monkeypatch.delenv("DELTABUS_POSTGRES_DSN", raising=False)
    monkeypatch.delenv("DELTABUS_OPENSEARCH_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    env_file = tmp_path / "team.env"
    dsn = "postgresql://someone:pg-s3cr3t@127.0.0.1:5999/served"
    env_file.write_text(f"DELTABUS_POSTGRES_DSN={dsn}\nDELTABUS_BUCKET=team-bucket\n")
    loaded = load_serving_settings(env_file)
    assert loaded.postgres_dsn is not None and loaded.postgres_dsn.get_secret_value() == dsn
    assert loaded.opensearch_url is None
    assert "pg-s3cr3t" not in repr(loaded)  # a secret, never printed
    assert loaded.to_env() == {"DELTABUS_POSTGRES_DSN": dsn}
    assert "postgres_dsn" not in Settings.model_fields  # core knows nothing of serving
    assert "DELTABUS_POSTGRES_DSN" not in child_env(load_settings(env_file))
    monkeypatch.setenv("DELTABUS_OPENSEARCH_URL", "http://u:os-s3cr3t@127.0.0.1:9299")
    assert ServingSettings().opensearch_url.get_secret_value().endswith(":9299")  # type: ignore[union-attr]


def test_child_environment_drops_the_parents_lake_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("MINIO_S3_SECRET_ACCESS_KEY", "parent-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://elsewhere")
    env = child_env(Settings(storage="local", local_root=tmp_path))
    assert "MINIO_S3_SECRET_ACCESS_KEY" not in env and "AWS_ENDPOINT_URL" not in env
    assert env["GX_ANALYTICS_ENABLED"] == "false"


def test_etl_command_carries_intervals_in_milliseconds(tmp_path: Path):
    command = etl_command(
        "continuous", commit_interval=0.1, poll_interval=0.02, ready_file=tmp_path / "r"
    )
    assert command[command.index("--commit-interval-ms") + 1] == "100"
    assert command[command.index("--poll-interval-ms") + 1] == "20"
    assert command[command.index("--mode") + 1] == "continuous"


def test_notify_url_must_be_a_relay_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_lake_env(monkeypatch)
    monkeypatch.setenv("DELTABUS_NOTIFY_URL", "ftp://relay:9100/events")
    with pytest.raises(ValueError, match="must start with http://"):
        Settings()
    monkeypatch.setenv("DELTABUS_NOTIFY_URL", "")
    assert Settings().notify_url is None  # empty: MinIO's own listen API


def test_env_file_writes_are_owner_only(tmp_path: Path) -> None:
    from deltabus.core.settings import append_env_file

    path = tmp_path / ".env"
    path.write_text("DELTABUS_PREFIX=mine\n")
    path.chmod(0o644)  # a file the user made: the secret about to be added must not be readable
    assert append_env_file(path, ["# written by a test", "DELTABUS_SECRET_KEY=s"]) == path
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == "DELTABUS_PREFIX=mine\n# written by a test\nDELTABUS_SECRET_KEY=s\n"
    fresh = tmp_path / "new.env"
    append_env_file(fresh, ["DELTABUS_POSTGRES_DSN=postgresql://u:p@127.0.0.1/db"])
    assert fresh.stat().st_mode & 0o777 == 0o600


def test_bare_key_variables_of_other_software_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_lake_env(monkeypatch)
    monkeypatch.setenv("SECRET_KEY", "a-web-framework-secret")  # e.g. Django's
    monkeypatch.setenv("ACCESS_KEY", "someone-elses")
    settings = load_settings()
    assert settings.secret_key is None and settings.access_key == "deltabus"
    named = Settings(access_key="mine", secret_key=SecretStr("s"))  # by field name still
    assert named.access_key == "mine" and named.secret_key.get_secret_value() == "s"
    monkeypatch.setenv("DELTABUS_SECRET_KEY", "lake-secret")
    assert load_settings().secret_key.get_secret_value() == "lake-secret"
