"""`LakeResource`: the engine's `Settings`/`Lake` as a Dagster resource."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from deltabus.core.retry import configure as configure_retry
from deltabus.core.settings import Settings, load_settings
from deltabus.delta.lake import Lake


class LakeResource(ConfigurableResource):
    """Where the Delta tables live (MinIO or a local directory), resolved like the engine does.

    Settings come from the DELTABUS_* environment variables (MINIO_S3_ACCESS_KEY and
    MINIO_S3_SECRET_ACCESS_KEY are accepted too) and `.env`; the fields here override them.
    The secret key is never part of this resource's config, so it never shows in the UI.
    """

    prefix: str | None = Field(
        default=None, description="Lake prefix instead of DELTABUS_PREFIX (s3://bucket/<prefix>)."
    )
    env_file: str | None = Field(
        default=None,
        description="Settings file (KEY=value lines); default $DELTABUS_ENV_FILE or ./.env.",
    )
    storage: str | None = Field(
        default=None, description="'minio' or 'local', instead of DELTABUS_STORAGE."
    )
    local_root: str | None = Field(
        default=None,
        description="Lake directory for storage=local, instead of DELTABUS_LOCAL_ROOT.",
    )

    def settings(self) -> Settings:
        overrides: dict[str, object] = {}
        if self.storage is not None:
            overrides["storage"] = self.storage
        if self.local_root is not None:
            overrides["local_root"] = Path(self.local_root)
        settings = load_settings(self.env_file, **overrides)
        configure_retry(settings.retry_max_wait_s)  # a budget set in .env counts here too
        return settings.with_prefix(self.prefix) if self.prefix else settings

    def lake(self, check: bool = False) -> Lake:
        """The lake; with `check=True` fail fast with one clear message when it is unusable
        (unreachable, wrong credentials, no bucket, read-only or full)."""
        lake = Lake(self.settings())
        if check:
            lake.check(write=True)
        return lake

    def describe(self) -> str:
        """Where the lake is, for logs and metadata (never includes the secret)."""
        return self.settings().describe()

    def subprocess_env(self) -> dict[str, str]:
        """DELTABUS_* variables that point an engine subprocess (`python -m deltabus`) here.

        Contains the secret key: pass it to the child's environment only, never log it.
        """
        return self.settings().to_env()
