"""Typed settings from environment variables and an optional `.env` file.

Every component (CLI, ETL process, Dagster resources, tests) builds its storage
configuration from this one object, so MinIO and a local directory share one code path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from deltabus.core.errors import ConfigError

ENV_FILE_VAR = "DELTABUS_ENV_FILE"
PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._=-]+")
PREFIX_HINT = (
    "use '/'-separated names of letters, digits, '.', '_', '-' and '=', "
    "e.g. lake or team/lake (no leading '/', no '..' and no empty parts)"
)


def check_prefix(value: str) -> str:
    """A lake prefix that stays inside the bucket (or local root): relative, no `..`.

    Trailing slashes are dropped; anything that could escape the lake root, or that
    storage would read differently from what was written, raises ValueError.
    """
    prefix = value.rstrip("/")
    if not prefix:
        raise ValueError("the prefix is empty")
    if prefix.startswith("/"):
        raise ValueError("an absolute path is not a prefix")
    for part in prefix.split("/"):
        if not part:
            raise ValueError("empty path segment ('//')")
        if part in (".", ".."):
            raise ValueError(f"'{part}' segments are not allowed")
        if not PREFIX_SEGMENT.fullmatch(part):
            raise ValueError(f"segment {part!r} has characters other than letters, digits, ._=-")
    return prefix


class Settings(BaseSettings):
    """Where the lake lives and how to reach it.

    `storage=minio` puts every table under `s3://<bucket>/<prefix>/` on the MinIO endpoint;
    `storage=s3` under the same path on AWS S3 (or the endpoint, when one is set);
    `storage=local` puts them under `local_root/<prefix>/` on this machine's disk.
    Credentials: the DELTABUS keys when a secret key is set, else the standard AWS chain
    (deltabus.delta.s3_access).
    """

    model_config = SettingsConfigDict(env_prefix="DELTABUS_", extra="ignore", populate_by_name=True)

    # Where the lake lives: `minio` (an S3-compatible endpoint, path-style requests), `s3`
    # (AWS S3: virtual-hosted requests, the region's endpoint) or `local` (a directory).
    storage: Literal["minio", "s3", "local"] = "minio"
    # Lake root directory when the storage is `local`.
    local_root: Path = Path("lake")
    # MinIO or S3 endpoint, `http://` or `https://`. With `storage=s3` it is used only when
    # set; unset, the clients use AWS S3's endpoint for the region.
    minio_endpoint: str = "http://127.0.0.1:9000"
    # Access key of the store.
    access_key: str = Field(
        "deltabus",
        validation_alias=AliasChoices("DELTABUS_ACCESS_KEY", "MINIO_S3_ACCESS_KEY"),
    )
    # Secret key of the store; never printed or logged. Unset: credentials come from the
    # standard AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN,
    # AWS_PROFILE, web identity, container or instance role), refreshed before they expire.
    secret_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("DELTABUS_SECRET_KEY", "MINIO_S3_SECRET_ACCESS_KEY"),
    )
    # Session token of temporary DELTABUS keys (an STS AssumeRole answer); never printed.
    session_token: SecretStr | None = None
    # AWS profile of the shared credentials / config files for the AWS chain; unset:
    # AWS_PROFILE, else `default`.
    profile: str | None = None
    # `auto`: virtual-hosted requests for AWS S3 (storage `s3` with no endpoint), path style
    # for MinIO and other endpoints; `path` or `virtual` to choose.
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    # Further object_store S3 options for delta-rs and obstore, as a JSON object of strings
    # (e.g. {"aws_server_side_encryption": "aws:kms"}); never printed.
    storage_options: dict[str, str] = Field(default_factory=dict)
    # Bucket of the lake: 3-63 lowercase letters, digits, `.` and `-`.
    bucket: str = "deltabus"
    # Region of the store; unset: the AWS chain's region (AWS_REGION, the profile), else
    # us-east-1.
    region: str | None = None
    # Prefix of the lake root, `s3://<bucket>/<prefix>/<table>`: `/`-separated names of
    # letters, digits and `._=-` (no leading `/`, no `..`, no empty parts).
    prefix: str = "lake"
    # Seconds of Delta log kept behind the last checkpoint in tables deltabus creates;
    # None keeps Delta's default (30 days). Tailing readers must never lag more than this.
    log_retention_s: int | None = Field(None, ge=10)
    # Seconds a removed data file stays in the log state (checkpoints, and the memory of every
    # writer and tail) of tables deltabus creates; None keeps Delta's default (1 week). A
    # table compacted while it streams holds one entry per file removed within it.
    deleted_file_retention_s: int | None = Field(None, ge=10)
    # Objects a second vacuum deletes, on average, in bulk requests of up to 1,000; 0 deletes
    # them as fast as the store takes them. A burst of deletes slows the store for the
    # streams beside it (docs/adr/0053).
    vacuum_deletes_per_s: float = Field(1000.0, ge=0, allow_inf_nan=False)
    # Seconds the time-zone pipeline's unified table keeps records: lake maintenance drops
    # its data files committed longer ago (as a stream's retention_s does); None keeps them.
    unified_retention_s: int | None = Field(None, ge=1)
    # Versions between the checkpoints deltabus writers write on a background thread.
    checkpoint_interval: int = Field(100, ge=1, le=10_000)
    # Seconds storage calls retry through an outage (core.retry), DELTABUS_RETRY_MAX_WAIT_S.
    retry_max_wait_s: float = Field(300.0, ge=0, allow_inf_nan=False)
    # Input commits that remove rows without change data (copy-on-write deletes on a table
    # without CDF) are skipped, logged and counted instead of stopping the ETL.
    skip_change_commits: bool = False
    # An input data file that cannot be read as Parquet: stop the ETL (exit 2) or skip the
    # file (logged and counted); `deltabus etl --on-corrupt-file` overrides it.
    on_corrupt_file: Literal["stop", "skip"] = "stop"
    # Tails are woken by the store's commit notifications (MinIO's ListenBucketNotification),
    # for stores that stream them as they happen; off by default because current MinIO
    # releases hold them back in batches (docs/adr/0032). Tails poll either way.
    notify: bool = False
    # Where commit events come from when `notify` is on: None reads MinIO's listen API at
    # the endpoint; a `deltabus notify relay` URL (http://host:port/events) reads the events
    # MinIO's webhook target pushes to that relay (deltabus.bus.notify_relay).
    notify_url: str | None = None
    # Longest pause between polls of a table that has gone quiet (milliseconds).
    idle_poll_ms: float = Field(1000.0, ge=1, le=60_000, allow_inf_nan=False)
    # A GET of the Delta log's hot path still unanswered after the store's recent p95 is
    # sent again, the first answer wins (deltabus.core.hedge); false sends every GET once.
    hedge_reads: bool = True
    # Port of this process's health endpoint for probes (GET /healthz, /readyz on 0.0.0.0,
    # deltabus.core.health); unset: none is served. `deltabus --health-port` wins over it.
    health_port: int | None = Field(None, ge=1, le=65535)
    # Port of this process's Prometheus endpoint (GET /metrics on 0.0.0.0,
    # deltabus.core.metrics); unset: none is served. `deltabus --metrics-port` wins over it.
    metrics_port: int | None = Field(None, ge=1, le=65535)

    @field_validator("prefix")
    @classmethod
    def _safe_prefix(cls, value: str) -> str:
        return check_prefix(value)

    @field_validator("bucket")
    @classmethod
    def _valid_bucket(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value):
            raise ValueError(
                "bucket names are 3-63 characters of lowercase letters, digits, '.' and '-'"
            )
        return value

    @field_validator("notify_url")
    @classmethod
    def _notify_url_is_http(cls, value: str | None) -> str | None:
        if value and not value.startswith("http://"):
            raise ValueError("must start with http:// (a deltabus notify relay)")
        return value or None

    @field_validator("minio_endpoint")
    @classmethod
    def _endpoint_has_scheme(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @property
    def endpoint(self) -> str | None:
        """The store's endpoint URL; None for AWS S3 reached through its regional endpoint
        (storage `s3` with no endpoint set)."""
        if self.storage == "s3" and "minio_endpoint" not in self.model_fields_set:
            return None
        return self.minio_endpoint

    @property
    def uses_aws_chain(self) -> bool:
        """Credentials come from the standard AWS chain (no DELTABUS secret key)."""
        return self.storage != "local" and self.secret_key is None

    def to_env(self) -> dict[str, str]:
        """DELTABUS_* variables that reproduce these settings in a child process.

        The one place settings cross a process boundary (ETL processes, the service,
        bench children, Dagster launches, tests). Holds the secret key: pass it to a
        child's environment only, never log it. The health port is not passed on: it
        belongs to one process, and a child would find it taken.
        """
        env = {
            "DELTABUS_STORAGE": self.storage,
            "DELTABUS_LOCAL_ROOT": str(Path(self.local_root).resolve()),
            "DELTABUS_ACCESS_KEY": self.access_key,
            "DELTABUS_BUCKET": self.bucket,
            "DELTABUS_PREFIX": self.prefix,
            "DELTABUS_ADDRESSING_STYLE": self.addressing_style,
            "DELTABUS_CHECKPOINT_INTERVAL": str(self.checkpoint_interval),
            "DELTABUS_RETRY_MAX_WAIT_S": f"{self.retry_max_wait_s:g}",
            "DELTABUS_SKIP_CHANGE_COMMITS": "true" if self.skip_change_commits else "false",
            "DELTABUS_ON_CORRUPT_FILE": self.on_corrupt_file,
            "DELTABUS_NOTIFY": "true" if self.notify else "false",
            "DELTABUS_IDLE_POLL_MS": f"{self.idle_poll_ms:g}",
            "DELTABUS_HEDGE_READS": "true" if self.hedge_reads else "false",
        }
        if self.endpoint is not None:
            env["DELTABUS_MINIO_ENDPOINT"] = self.endpoint
        if self.region is not None:
            env["DELTABUS_REGION"] = self.region
        if self.profile is not None:
            env["DELTABUS_PROFILE"] = self.profile
        if self.storage_options:
            env["DELTABUS_STORAGE_OPTIONS"] = json.dumps(self.storage_options)
        if self.session_token is not None:
            env["DELTABUS_SESSION_TOKEN"] = self.session_token.get_secret_value()
        if self.notify_url:
            env["DELTABUS_NOTIFY_URL"] = self.notify_url
        if self.log_retention_s is not None:
            env["DELTABUS_LOG_RETENTION_S"] = str(self.log_retention_s)
        if self.deleted_file_retention_s is not None:
            env["DELTABUS_DELETED_FILE_RETENTION_S"] = str(self.deleted_file_retention_s)
        env["DELTABUS_VACUUM_DELETES_PER_S"] = f"{self.vacuum_deletes_per_s:g}"
        if self.unified_retention_s is not None:
            env["DELTABUS_UNIFIED_RETENTION_S"] = str(self.unified_retention_s)
        if self.secret_key is not None:
            env["DELTABUS_SECRET_KEY"] = self.secret_key.get_secret_value()
        return env

    def with_prefix(self, prefix: str) -> Settings:
        """The same lake connection under another prefix (benchmarks and tests use fresh ones).

        The prefix is validated as DELTABUS_PREFIX is (model_copy skips validators).
        """
        try:
            safe = check_prefix(prefix)
        except ValueError as exc:
            raise ConfigError(f"invalid lake prefix {prefix!r}: {exc}", PREFIX_HINT) from None
        return self.model_copy(update={"prefix": safe})

    def describe(self) -> str:
        """Where the lake is, for log lines: never includes the secret."""
        if self.storage == "local":
            return f"local directory {self.local_root.resolve() / self.prefix}"
        return f"s3://{self.bucket}/{self.prefix} on {self.endpoint or 'AWS S3'}"


def append_env_file(env_file: str | os.PathLike[str] | None, lines: list[str]) -> Path:
    """Append `lines` to the `.env` file settings are read from, readable by its owner only.

    Args:
        env_file: the file; else `$DELTABUS_ENV_FILE`, else `./.env` (created if missing).
        lines: the lines to add (a comment saying what wrote them, then KEY=value lines).

    Returns:
        The file's path. Its mode is 600 afterwards, whatever it was: it holds secrets.
    """
    path = Path(env_file or os.environ.get(ENV_FILE_VAR) or ".env")
    with path.open("a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def settings_file(env_file: str | os.PathLike[str] | None = None) -> Path | None:
    """The `.env` file settings are read from: `env_file`, else `$DELTABUS_ENV_FILE`, else
    `./.env` when it exists, else None.

    Raises:
        ConfigError: the file cannot be read as UTF-8 text (never silently skipped).
    """
    given = env_file or os.environ.get(ENV_FILE_VAR)
    if not given and not Path(".env").is_file():
        return None
    path = Path(given or ".env")
    where = f"settings file {path}" if given else f"settings file {path.absolute()}"
    try:
        path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read {where}: {exc.strerror or exc}",
            f"check the path and permissions, or unset {ENV_FILE_VAR}"
            if given
            else "fix its permissions, or remove it",
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"{where} is not UTF-8 text",
            "save it as plain UTF-8 KEY=value lines"
            + ("" if given else " (or remove it: deltabus reads ./.env when present)"),
        ) from None
    return path


def load_settings(env_file: str | os.PathLike[str] | None = None, **overrides: object) -> Settings:
    """Build settings from the environment, a `.env` file and explicit overrides.

    Args:
        env_file: the `.env` file to read; else `$DELTABUS_ENV_FILE`, else `./.env` when
            it exists.
        **overrides: field values that win over the environment and the file.

    Returns:
        The validated settings (secrets as `SecretStr`, never printed).

    Raises:
        ConfigError: a named `.env` file cannot be read (never silently skipped), or a
            value is invalid; the message names the variable and how to fix it.

    Example:
        `load_settings(prefix="lake/dev", minio_endpoint="http://127.0.0.1:9000")`
    """
    path = settings_file(env_file)
    try:
        return Settings(_env_file=path, **overrides)  # type: ignore[call-arg]
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(_describe(err) for err in errors)
        bad_prefix = any(err["loc"] and err["loc"][0] == "prefix" for err in errors)
        raise ConfigError(
            f"invalid settings: {problems}",
            f"DELTABUS_PREFIX: {PREFIX_HINT}"
            if bad_prefix
            else "see the Configuration section of README.md for the accepted values",
        ) from None


# Fields whose values are never shown, not even in a validation error.
SECRET_FIELDS = frozenset({"secret_key", "session_token", "storage_options"})


def _describe(err: Any) -> str:
    """One validation error as `field (VARIABLE=value): message`, never showing the secret."""
    field = str(err["loc"][0]) if err["loc"] else ""
    info = Settings.model_fields.get(field)
    if info is None:
        return f"{field or 'settings'}: {err['msg']}"
    alias = info.validation_alias
    variable = alias.choices[0] if isinstance(alias, AliasChoices) else f"DELTABUS_{field.upper()}"
    shown = ""
    if field not in SECRET_FIELDS and isinstance(err.get("input"), str | int | float):
        shown = f"={str(err['input'])[:80]!r}"
    return f"{field} ({variable}{shown}): {err['msg']}"
