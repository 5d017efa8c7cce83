"""Where the serving sinks write: PostgreSQL and OpenSearch, from `DELTABUS_*` variables
and the same `.env` file as the lake's settings. They belong to the serving layer; the
lake's settings (deltabus.core.settings) know nothing of them."""

from __future__ import annotations

import os

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from deltabus.core.settings import settings_file


class ServingSettings(BaseSettings):
    """The serving stores. Both hold credentials, so both are secrets: never printed."""

    model_config = SettingsConfigDict(env_prefix="DELTABUS_", extra="ignore")

    # PostgreSQL the serving sink writes to (`deltabus serve postgres`), as a libpq URI or
    # key=value string; holds a password, so it is a secret. None: a local server is started.
    postgres_dsn: SecretStr | None = None
    # OpenSearch the index sink writes to (`deltabus serve opensearch`), as an http(s) URL;
    # may hold user:password, so it is a secret. None: `deltabus opensearch up` starts one.
    opensearch_url: SecretStr | None = None

    def to_env(self) -> dict[str, str]:
        """The variables that give a child process these settings."""
        env = {}
        if self.postgres_dsn is not None:
            env["DELTABUS_POSTGRES_DSN"] = self.postgres_dsn.get_secret_value()
        if self.opensearch_url is not None:
            env["DELTABUS_OPENSEARCH_URL"] = self.opensearch_url.get_secret_value()
        return env


def load_serving_settings(env_file: str | os.PathLike[str] | None = None) -> ServingSettings:
    """The serving settings from the environment and the settings file the lake's come from
    (`env_file`, else `$DELTABUS_ENV_FILE`, else `./.env` when present)."""
    return ServingSettings(_env_file=settings_file(env_file))  # type: ignore[call-arg]
