"""Typed settings from environment variables and an optional `.env` file.

Every component (CLI, ETL process, Dagster resources, tests) builds its storage
configuration from this one object, so MinIO and a local directory share one code path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from deltabus.errors import ConfigError

ENV_FILE_VAR = "DELTABUS_ENV_FILE"


class Settings(BaseSettings):
    """Where the lake lives and how to reach it.

    `storage=minio` puts every table under `s3://<bucket>/<prefix>/` on the MinIO endpoint;
    `storage=local` puts them under `local_root/<prefix>/` on this machine's disk.
    """

    model_config = SettingsConfigDict(env_prefix="DELTABUS_", extra="ignore", populate_by_name=True)

    storage: Literal["minio", "local"] = "minio"
    local_root: Path = Path("lake")
    minio_endpoint: str = "http://127.0.0.1:9000"
    access_key: str = Field(
        "deltabus",
        validation_alias=AliasChoices("DELTABUS_ACCESS_KEY", "MINIO_S3_ACCESS_KEY", "access_key"),
    )
    secret_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices(
            "DELTABUS_SECRET_KEY", "MINIO_S3_SECRET_ACCESS_KEY", "secret_key"
        ),
    )
    bucket: str = "deltabus"
    region: str = "us-east-1"
    prefix: str = "lake"
    # Seconds of Delta log kept behind the last checkpoint in tables deltabus creates;
    # None keeps Delta's default (30 days). Tailing readers must never lag more than this.
    log_retention_s: int | None = Field(None, ge=10)
    # Versions between the checkpoints deltabus writers write on a background thread.
    checkpoint_interval: int = Field(100, ge=1, le=10_000)

    @field_validator("prefix")
    @classmethod
    def _strip_slashes(cls, value: str) -> str:
        return value.strip("/")

    @field_validator("bucket")
    @classmethod
    def _valid_bucket(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value):
            raise ValueError(
                "bucket names are 3-63 characters of lowercase letters, digits, '.' and '-'"
            )
        return value

    @field_validator("minio_endpoint")
    @classmethod
    def _endpoint_has_scheme(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    def with_prefix(self, prefix: str) -> Settings:
        """The same lake connection under another prefix (benchmarks and tests use fresh ones)."""
        return self.model_copy(update={"prefix": prefix.strip("/")})

    def describe(self) -> str:
        """Where the lake is, for log lines: never includes the secret."""
        if self.storage == "local":
            return f"local directory {self.local_root.resolve() / self.prefix}"
        return f"s3://{self.bucket}/{self.prefix} on {self.minio_endpoint}"


def load_settings(env_file: str | os.PathLike[str] | None = None, **overrides: object) -> Settings:
    """Build settings from the environment, a `.env` file and explicit overrides.

    The `.env` file is `env_file`, else `$DELTABUS_ENV_FILE`, else `./.env` when it exists.
    A named file that cannot be read is an error, never silently skipped.
    """
    path = env_file or os.environ.get(ENV_FILE_VAR)
    if path:
        path = Path(path)
        try:
            path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot read settings file {path}: {exc.strerror or exc}",
                f"check the path and permissions, or unset {ENV_FILE_VAR}",
            ) from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"settings file {path} is not UTF-8 text", "save it as plain KEY=value lines"
            ) from exc
    elif Path(".env").is_file():
        path = Path(".env")
    try:
        return Settings(_env_file=path, **overrides)  # type: ignore[call-arg]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(
            f"invalid settings: {problems}",
            "see the Configuration section of README.md for the accepted values",
        ) from None
