"""The lake: where tables live, how delta-rs and boto3 reach them, and clear storage errors.

One `Lake` serves MinIO and a local directory; only the URI scheme and the storage
options differ, so every reader and writer takes the same code path.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from deltabus.errors import StorageError
from deltabus.settings import Settings

log = logging.getLogger(__name__)

INPUT_TABLES = ("timezone1", "timezone2")
UNIFIED_TABLE = "timezone_unified"
REJECTS_TABLE = "rejects"
TABLE_ZONES = {"timezone1": "America/New_York", "timezone2": "Europe/Paris"}


class Lake:
    """Table locations and storage access for one lake root."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    def is_local(self) -> bool:
        return self.settings.storage == "local"

    @property
    def root(self) -> str:
        """The lake root URI (a directory path for local storage)."""
        s = self.settings
        if self.is_local:
            return str(s.local_root.resolve() / s.prefix).rstrip("/")
        return f"s3://{s.bucket}/{s.prefix}".rstrip("/")

    def uri(self, table: str) -> str:
        return f"{self.root}/{table}"

    @cached_property
    def storage_options(self) -> dict[str, str] | None:
        """delta-rs storage options; `None` for a local directory."""
        s = self.settings
        if self.is_local:
            return None
        options = {
            "AWS_ENDPOINT_URL": s.minio_endpoint,
            "AWS_ACCESS_KEY_ID": s.access_key,
            "AWS_SECRET_ACCESS_KEY": s.secret_key.get_secret_value() if s.secret_key else "",
            "AWS_REGION": s.region,
            # MinIO supports conditional PUT (If-None-Match), which makes concurrent
            # commits safe without an external lock.
            "conditional_put": "etag",
            "AWS_S3_ADDRESSING_STYLE": "path",
            "connect_timeout": "5s",
            "timeout": "30s",
        }
        if s.minio_endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
        return options

    # -- boto3, for bucket checks and bootstrap -------------------------------------

    def s3_client(self, *, connect_timeout: float = 3.0, attempts: int = 1) -> Any:
        import boto3
        from botocore.config import Config

        s = self.settings
        self.require_secret()
        return boto3.client(
            "s3",
            endpoint_url=s.minio_endpoint,
            aws_access_key_id=s.access_key,
            aws_secret_access_key=s.secret_key.get_secret_value(),  # type: ignore[union-attr]
            region_name=s.region,
            config=Config(
                connect_timeout=connect_timeout,
                read_timeout=10,
                retries={"max_attempts": attempts, "mode": "standard"},
                s3={"addressing_style": "path"},
            ),
        )

    def require_secret(self) -> None:
        if not self.is_local and self.settings.secret_key is None:
            raise StorageError(
                "no MinIO secret key is configured",
                "set DELTABUS_SECRET_KEY (or MINIO_S3_SECRET_ACCESS_KEY) in the environment "
                "or .env, or use DELTABUS_STORAGE=local",
            )

    def check(self) -> None:
        """Fail fast, with one clear message, when the lake cannot be used.

        Names the problem (unreachable endpoint, wrong credentials, missing bucket) and
        the fix; never includes the secret.
        """
        if self.is_local:
            root = Path(self.root)
            parent = next((p for p in [root, *root.parents] if p.exists()), None)
            if parent is None or not parent.is_dir():
                raise StorageError(
                    f"lake root {root} is not inside a directory", "set DELTABUS_LOCAL_ROOT"
                )
            return
        from botocore.exceptions import ClientError, EndpointConnectionError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        s = self.settings
        client = self.s3_client()
        try:
            client.list_objects_v2(Bucket=s.bucket, MaxKeys=1)
        except (EndpointConnectionError, BotoConnectionError) as exc:
            raise StorageError(
                f"cannot reach MinIO at {s.minio_endpoint} ({type(exc).__name__})",
                "start MinIO (`make minio`) or set DELTABUS_MINIO_ENDPOINT to a running server",
            ) from None
        except ClientError as exc:
            raise _client_error(exc, s) from None

    def init_bucket(self) -> bool:
        """Create the bucket if needed; returns True when it was created."""
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            return False
        from botocore.exceptions import ClientError, EndpointConnectionError

        s = self.settings
        client = self.s3_client()
        try:
            client.create_bucket(Bucket=s.bucket)
            return True
        except EndpointConnectionError:
            raise StorageError(
                f"cannot reach MinIO at {s.minio_endpoint}",
                "start MinIO (`make minio`) or set DELTABUS_MINIO_ENDPOINT",
            ) from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return False
            raise _client_error(exc, s) from None

    # -- Delta tables ----------------------------------------------------------------

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options)

    def has_objects(self, table: str) -> bool:
        """True when something (Delta or not) is stored at the table's location."""
        if self.is_local:
            path = Path(self.uri(table))
            return path.is_dir() and any(path.iterdir())
        listing = self.s3_client().list_objects_v2(
            Bucket=self.settings.bucket, Prefix=f"{self.settings.prefix}/{table}/", MaxKeys=1
        )
        return listing.get("KeyCount", 0) > 0

    def require_delta_or_absent(self, table: str) -> bool:
        """True if `table` is a Delta table, False if nothing is there; else a clear error."""
        if self.exists(table):
            return True
        if self.has_objects(table):
            raise StorageError(
                f"{self.uri(table)} holds files but is not a Delta table (no _delta_log)",
                "point DELTABUS_PREFIX at a deltabus lake, or move those files away",
            )
        return False

    def open(self, table: str, version: int | None = None) -> DeltaTable:
        """Open a Delta table, with a clear error when there is none at that path."""
        try:
            return DeltaTable(
                self.uri(table), version=version, storage_options=self.storage_options
            )
        except TableNotFoundError:
            if self.has_objects(table):
                self.require_delta_or_absent(table)
            raise StorageError(
                f"no Delta table at {self.uri(table)}",
                "check DELTABUS_PREFIX / DELTABUS_BUCKET, or run `deltabus produce` first",
            ) from None


def _client_error(exc: Any, s: Settings) -> StorageError:
    error = exc.response.get("Error", {})
    code = error.get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("NoSuchBucket",) or status == 404:
        return StorageError(
            f"bucket '{s.bucket}' does not exist on {s.minio_endpoint}",
            "create it with `deltabus init-bucket`, or set DELTABUS_BUCKET",
        )
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"):
        return StorageError(
            f"MinIO at {s.minio_endpoint} rejected the credentials for access key "
            f"'{s.access_key}' ({code})",
            "check DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY (or MINIO_S3_ACCESS_KEY / "
            "MINIO_S3_SECRET_ACCESS_KEY)",
        )
    if code == "AccessDenied" or status == 403:
        return StorageError(
            f"access key '{s.access_key}' may not use bucket '{s.bucket}' ({code or status})",
            "grant the key read/write on the bucket (see README: least-privilege policy)",
        )
    return StorageError(
        f"MinIO at {s.minio_endpoint} answered {code or status}: {error.get('Message', '')}",
        "check the MinIO server logs",
    )
