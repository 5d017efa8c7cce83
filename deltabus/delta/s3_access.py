"""How every client reaches the lake's S3 store: credentials, region, endpoint, addressing.

The one place settings become client options: delta-rs `storage_options`, the obstore
store, boto3 clients, SigV4 signing (commit notifications) and Spark's s3a. Two sources
of credentials:

- `static`: the keys in DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY (or the MINIO_S3_*
  names), with DELTABUS_SESSION_TOKEN when they are temporary. The local MinIO's default.
- `aws`: with no DELTABUS secret key, the standard AWS chain as botocore resolves it:
  AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and the
  shared files (SSO and assume-role profiles too), web identity
  (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, as IRSA injects), container and instance
  metadata. Temporary credentials are refreshed before they expire: obstore asks botocore
  again every few minutes, and each delta-rs handle is opened with the keys current then.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from deltabus.core.errors import ConfigError, StorageError
from deltabus.core.settings import Settings

# How long obstore keeps credentials from the chain before asking botocore again (which
# answers from its cache, or refreshes when they are within minutes of expiring).
CHAIN_CREDENTIALS_TTL = timedelta(minutes=5)
DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class Keys:
    """One set of credentials as a request signs with them."""

    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:  # never show the secret or the token
        return f"Keys(access_key={self.access_key!r})"


class S3Access:
    """The lake's S3 credentials and connection options, resolved once per `Lake`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    # -- credentials ---------------------------------------------------------------------

    @property
    def source(self) -> str:
        """`static` (DELTABUS keys) or `aws` (the standard AWS credential chain)."""
        return "static" if self.settings.secret_key is not None else "aws"

    @cached_property
    def _botocore_session(self) -> Any:
        import botocore.session
        from botocore.exceptions import ProfileNotFound

        try:
            return botocore.session.Session(profile=self.settings.profile)
        except ProfileNotFound:
            raise self._no_profile() from None

    @cached_property
    def _chain(self) -> Any:
        """botocore's credentials from the standard chain (refreshable when temporary)."""
        from botocore.exceptions import BotoCoreError, ProfileNotFound

        try:
            credentials = self._botocore_session.get_credentials()
        except ProfileNotFound:
            raise self._no_profile() from None
        except BotoCoreError as exc:
            raise StorageError(
                f"the AWS credential chain failed: {type(exc).__name__}: {exc}",
                "fix the AWS configuration it names (profile, web identity token file, "
                "role), or set DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY",
            ) from None
        if credentials is None:
            raise StorageError(
                "no credentials for the lake: DELTABUS_SECRET_KEY is not set and the AWS "
                "credential chain found none",
                "set DELTABUS_SECRET_KEY (or MINIO_S3_SECRET_ACCESS_KEY) for a MinIO, or AWS "
                "credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), "
                "AWS_PROFILE, a web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN) or an "
                "instance role; or use DELTABUS_STORAGE=local",
            )
        return credentials

    def _no_profile(self) -> ConfigError:
        return ConfigError(
            f"AWS profile '{self.settings.profile}' is not in the shared credentials or config "
            "file",
            "check AWS_PROFILE / DELTABUS_PROFILE, or AWS_SHARED_CREDENTIALS_FILE / "
            "AWS_CONFIG_FILE",
        )

    def keys(self) -> Keys:
        """The credentials to sign with now (refreshed first when they are about to expire).

        Raises:
            StorageError: no credentials can be found, or the chain fails.
        """
        s = self.settings
        if s.secret_key is not None:
            token = s.session_token.get_secret_value() if s.session_token else None
            return Keys(s.access_key, s.secret_key.get_secret_value(), token)
        from botocore.exceptions import BotoCoreError

        try:
            frozen = self._chain.get_frozen_credentials()
        except BotoCoreError as exc:
            raise StorageError(
                f"could not refresh the AWS credentials ({self.describe_credentials()}): "
                f"{type(exc).__name__}",
                "check that the role or profile can still be assumed",
            ) from None
        return Keys(frozen.access_key, frozen.secret_key, frozen.token)

    def check_credentials(self) -> None:
        """Fail with one clear message when no credentials can be found (no request)."""
        if self.source == "aws":
            self._chain  # noqa: B018 - resolves, or raises the clear error

    def describe_credentials(self) -> str:
        """Which credential is in use, for messages: names variables, never values."""
        s = self.settings
        if s.secret_key is not None:
            names = "DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY"
            if s.session_token is not None:
                names += " / DELTABUS_SESSION_TOKEN"
            return f"access key '{s.access_key}' from {names}"
        method = getattr(self._chain, "method", "aws")
        where = {
            "env": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
            + (" / AWS_SESSION_TOKEN" if os.environ.get("AWS_SESSION_TOKEN") else ""),
            "shared-credentials-file": f"profile '{self._profile_name()}' in the shared "
            "credentials file",
            "config-file": f"profile '{self._profile_name()}' in the AWS config file",
            "assume-role": f"the role of profile '{self._profile_name()}'",
            "assume-role-with-web-identity": "the web identity (AWS_WEB_IDENTITY_TOKEN_FILE, "
            "AWS_ROLE_ARN)",
            "container-role": "the container's role",
            "iam-role": "the instance's role",
            "sso": f"the SSO session of profile '{self._profile_name()}'",
        }.get(method, f"the AWS credential chain ({method})")
        return f"access key '{self.keys().access_key}' from {where}"

    def fix_credentials(self) -> str:
        """How to fix rejected credentials, for the source in use."""
        if self.source == "static":
            return (
                "check DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY (or MINIO_S3_ACCESS_KEY / "
                "MINIO_S3_SECRET_ACCESS_KEY)"
                + (
                    "; temporary credentials expire: get new ones and set "
                    "DELTABUS_SESSION_TOKEN with them"
                    if self.settings.session_token is not None
                    else ""
                )
            )
        return (
            "get valid AWS credentials for the chain (new temporary credentials from "
            "`aws sts assume-role` or `aws sso login`, the right AWS_PROFILE, a readable web "
            "identity token), or set DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY"
        )

    def _profile_name(self) -> str:
        return self.settings.profile or os.environ.get("AWS_PROFILE") or "default"

    # -- where the store is --------------------------------------------------------------

    @cached_property
    def region(self) -> str:
        """DELTABUS_REGION, else the AWS chain's region (AWS_REGION, the profile), else
        us-east-1."""
        if self.settings.region:
            return self.settings.region
        if self.settings.storage == "s3":
            found = self._botocore_session.get_config_variable("region")
            if found:
                return str(found)
        return DEFAULT_REGION

    @property
    def endpoint(self) -> str | None:
        """The endpoint URL; None for AWS S3 (the clients pick the region's endpoint)."""
        return self.settings.endpoint

    @property
    def virtual_hosted(self) -> bool:
        """Virtual-hosted style (AWS S3) or path style (MinIO and other endpoints)."""
        style = self.settings.addressing_style
        if style == "auto":
            return self.endpoint is None
        return style == "virtual"

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def describe_store(self) -> str:
        """The store, for messages: `MinIO at <url>`, `S3 at <url>` or `AWS S3 (<region>)`."""
        if self.endpoint is None:
            return f"AWS S3 ({self.region})"
        kind = "MinIO" if self.settings.storage == "minio" else "S3"
        return f"{kind} at {self.endpoint}"

    # -- client options ------------------------------------------------------------------

    def delta_options(self) -> dict[str, str]:
        """delta-rs `storage_options` with the keys current now (refreshed first when
        temporary ones are about to expire): a table handle keeps the keys it was opened
        with, so long-lived handles are opened again (checkpoints, appends after an error)."""
        options = {
            "AWS_REGION": self.region,
            # S3 and MinIO support conditional PUT (If-None-Match), which makes concurrent
            # commits safe without an external lock.
            "conditional_put": "etag",
            "AWS_S3_ADDRESSING_STYLE": "virtual" if self.virtual_hosted else "path",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true" if self.virtual_hosted else "false",
            "connect_timeout": "5s",
            "timeout": "30s",
            # Few, short request retries (delta-rs' own are 10 over up to 180 s): an
            # outage is waited out by `retry_storage`, which keeps the budget and honours a
            # stop.
            "max_retries": "2",
            "retry_timeout": "10s",
        }
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
        if self.allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        keys = self.keys()
        options["AWS_ACCESS_KEY_ID"] = keys.access_key
        options["AWS_SECRET_ACCESS_KEY"] = keys.secret_key
        if keys.token:
            options["AWS_SESSION_TOKEN"] = keys.token
        options.update(self.settings.storage_options)
        return options

    def obstore_store(self, prefix: str | None) -> Any:
        """An obstore `S3Store` on the lake's bucket under `prefix`."""
        from obstore.exceptions import BaseError
        from obstore.store import S3Store

        s = self.settings
        kwargs: dict[str, Any] = {}
        if self.source == "static":
            keys = self.keys()
            kwargs["access_key_id"] = keys.access_key
            kwargs["secret_access_key"] = keys.secret_key
            if keys.token:
                kwargs["token"] = keys.token
        else:
            kwargs["credential_provider"] = self.chain_provider()
        if self.endpoint:
            kwargs["endpoint"] = self.endpoint
        try:
            return S3Store(
                s.bucket,
                prefix=prefix,
                region=self.region,
                virtual_hosted_style_request=self.virtual_hosted,
                config=dict(s.storage_options) or None,
                client_options={
                    "allow_http": self.allow_http,
                    "connect_timeout": timedelta(seconds=5),
                    "timeout": timedelta(seconds=30),
                },
                retry_config={
                    "max_retries": 1,
                    "retry_timeout": timedelta(seconds=10),
                    "backoff": {
                        "init_backoff": timedelta(milliseconds=50),
                        "max_backoff": timedelta(seconds=1),
                        "base": 2.0,
                    },
                },
                **kwargs,
            )
        except BaseError as exc:
            raise ConfigError(
                f"the S3 store options are not valid: {type(exc).__name__}",
                "check DELTABUS_STORAGE_OPTIONS: keys are object_store's S3 options "
                "(e.g. aws_server_side_encryption)",
            ) from None

    def chain_provider(self) -> Callable[[], dict[str, Any]]:
        """An obstore credential provider over the AWS chain (refreshed by botocore)."""
        self.check_credentials()

        def provide() -> dict[str, Any]:
            keys = self.keys()
            return {
                "access_key_id": keys.access_key,
                "secret_access_key": keys.secret_key,
                "token": keys.token,
                "expires_at": datetime.now(UTC) + CHAIN_CREDENTIALS_TTL,
            }

        return provide

    def boto3_client(
        self, service: str = "s3", *, connect_timeout: float, read_timeout: float, attempts: int
    ) -> Any:
        """A boto3 client with the lake's credentials, region, endpoint and addressing."""
        import boto3
        from botocore.config import Config

        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": attempts, "mode": "standard"},
            s3={"addressing_style": "virtual" if self.virtual_hosted else "path"},
        )
        if self.source == "static":
            keys = self.keys()
            return boto3.client(
                service,
                endpoint_url=self.endpoint,
                aws_access_key_id=keys.access_key,
                aws_secret_access_key=keys.secret_key,
                aws_session_token=keys.token,
                region_name=self.region,
                config=config,
            )
        self.check_credentials()
        return self._boto3_session.client(
            service, endpoint_url=self.endpoint, region_name=self.region, config=config
        )

    @cached_property
    def _boto3_session(self) -> Any:
        """One boto3 session over the botocore one (a second would register boto3's
        handlers on it twice)."""
        import boto3

        return boto3.session.Session(botocore_session=self._botocore_session)

    def spark_conf(self) -> dict[str, str]:
        """Spark's s3a options (hadoop-aws) for the lake, without the keys: those go in
        `spark_env`, since pyspark puts every option on the JVM's command line."""
        conf = {
            "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.hadoop.fs.s3a.path.style.access": "false" if self.virtual_hosted else "true",
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false" if self.allow_http else "true",
            # Reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN.
            "spark.hadoop.fs.s3a.aws.credentials.provider": (
                "com.amazonaws.auth.EnvironmentVariableCredentialsProvider"
            ),
        }
        if self.endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
        return conf

    def spark_env(self) -> dict[str, str]:
        """The environment that gives Spark's JVM the current keys (`spark_conf`)."""
        keys = self.keys()
        env = {"AWS_ACCESS_KEY_ID": keys.access_key, "AWS_SECRET_ACCESS_KEY": keys.secret_key}
        if keys.token:
            env["AWS_SESSION_TOKEN"] = keys.token
        return env
