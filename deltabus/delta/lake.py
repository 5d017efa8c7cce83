"""The lake: where tables live, how delta-rs and boto3 reach them, and clear storage errors.

One `Lake` serves MinIO and a local directory; only the URI scheme and the storage
options differ, so every reader and writer takes the same code path.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import obstore
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from deltabus.core import hedge
from deltabus.core.errors import StorageError, user_storage_error
from deltabus.core.retry import retry_storage
from deltabus.core.settings import Settings
from deltabus.delta.s3_access import S3Access

log = logging.getLogger(__name__)
T = TypeVar("T")

# Seconds files may sit at a table's location without a Delta log before that is an error.
NOT_DELTA_GRACE_S = 10.0
# Written and deleted under the lake root by `check(write=True)`; never a table name.
PROBE_NAME = "_deltabus_write_probe"


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
    def access(self) -> S3Access:
        """Credentials, region, endpoint and every S3 client's options (delta.s3_access)."""
        return S3Access(self.settings)

    @property
    def storage_options(self) -> dict[str, str] | None:
        """delta-rs storage options, with the credentials current now; `None` for a local
        directory."""
        if self.is_local:
            return None
        return self.access.delta_options()

    @cached_property
    def object_store(self) -> Any:
        """An obstore store rooted at the lake root, shared by the process's hot paths.

        The Delta log's hot path (tail polls, fast-append commits) uses it: a GET that
        404s is one request (pyarrow's S3 filesystem sends a HEAD before every read), and a
        PUT can be conditional (`mode="create"`, If-None-Match), which is how a commit
        claims its version. One store per `Lake` means one connection pool per process.
        Its own retries are few and short: `retry_storage` owns the waiting. Temporary
        credentials from the AWS chain are refreshed by the store itself.
        """
        from obstore.store import LocalStore

        if self.is_local:
            root = Path(self.root)
            root.mkdir(parents=True, exist_ok=True)
            return LocalStore(root)
        store = self.access.obstore_store(self.settings.prefix or None)
        hedge.timer_of(store).enabled = self.settings.hedge_reads
        return store

    # -- boto3, for bucket checks and bootstrap -------------------------------------

    def s3_client(
        self, *, connect_timeout: float = 3.0, read_timeout: float = 10.0, attempts: int = 1
    ) -> Any:
        """A boto3 S3 client for the lake's store (credentials, region, addressing)."""
        return self.access.boto3_client(
            connect_timeout=connect_timeout, read_timeout=read_timeout, attempts=attempts
        )

    def require_credentials(self) -> None:
        """Fail with one clear message when no credentials can be found (no request)."""
        if not self.is_local:
            self.access.check_credentials()

    def check(self, write: bool = False) -> None:
        """Fail fast, with one clear message, when the lake cannot be used.

        Names the problem (unreachable or unresponsive endpoint, wrong credentials,
        missing bucket, and with `write` a read-only or full lake) and the fix; never
        includes the secret. `write` writes a small probe object under the lake root and
        deletes it again.
        """
        if self.is_local:
            root = Path(self.root)
            parent = next((p for p in [root, *root.parents] if p.exists()), None)
            if parent is None or not parent.is_dir():
                raise StorageError(
                    f"lake root {root} is not inside a directory", "set DELTABUS_LOCAL_ROOT"
                )
            if write:
                self._probe_local(root)
            return
        s = self.settings
        client = self.s3_client(read_timeout=min(10.0, max(1.0, s.retry_max_wait_s / 4)))
        self._s3(lambda: client.list_objects_v2(Bucket=s.bucket, MaxKeys=1), "list the bucket")
        if write:
            self._probe_s3(client)

    def _probe_local(self, root: Path) -> None:
        """Create the lake root if needed, write and delete a file in it, undo the mkdirs."""
        created: list[Path] = []
        try:
            for directory in reversed([p for p in [root, *root.parents] if not p.exists()]):
                directory.mkdir()
                created.append(directory)
            probe = root / PROBE_NAME
            probe.write_bytes(b"deltabus write probe\n")
            probe.unlink()
        except OSError as exc:
            raise user_storage_error(exc, self.settings.describe()) or StorageError(
                f"cannot write to the lake root {root}: {exc.strerror or exc}",
                "make it writable, or set DELTABUS_LOCAL_ROOT / DELTABUS_PREFIX",
            ) from None
        finally:
            for directory in reversed(created):
                try:
                    directory.rmdir()
                except OSError:
                    pass

    def _probe_s3(self, client: Any) -> None:
        """Put a small object under the lake prefix and delete it (a key without
        s3:DeleteObject, which only maintenance needs, leaves it in place)."""
        from botocore.exceptions import BotoCoreError, ClientError

        s = self.settings
        key = f"{s.prefix}/{PROBE_NAME}"
        try:
            self._s3(
                lambda: client.put_object(Bucket=s.bucket, Key=key, Body=b"deltabus write probe\n"),
                "write a probe object",
                raw_client_errors=True,
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "AccessDenied":
                raise StorageError(
                    f"{self.access.describe_credentials()} may not write to "
                    f"s3://{s.bucket}/{s.prefix} on {self.access.describe_store()} "
                    "(AccessDenied on PutObject): the lake is read-only "
                    "for this key",
                    "grant the key s3:PutObject on the bucket (README, Security: the "
                    "least-privilege policy), or use a key that has it",
                ) from None
            raise user_storage_error(exc, s.describe()) or _client_error(exc, self.access) from None
        try:
            client.delete_object(Bucket=s.bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:  # the probe is written: reachable, writable
            log.debug("could not delete the write probe %s: %s", key, exc)

    def _s3(self, fn: Callable[[], T], what: str, *, raw_client_errors: bool = False) -> T:
        """One boto3 call: retried through timeouts and 5xx answers within the retry budget
        (a MinIO that is starting or overloaded); refused connections and 4xx answers fail
        at once. Each failure becomes one clear message."""
        from botocore.exceptions import (
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )
        from botocore.exceptions import ConnectionError as BotoConnectionError

        s = self.settings

        def passing(exc: BaseException) -> bool:
            if isinstance(exc, ReadTimeoutError | ConnectTimeoutError):
                return True
            if not isinstance(exc, ClientError) or user_storage_error(exc) is not None:
                return False
            return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500

        started = time.monotonic()
        try:
            return retry_storage(fn, what=what, max_wait=s.retry_max_wait_s, transient=passing)
        except ReadTimeoutError:
            raise StorageError(
                f"{self.access.describe_store()} accepts connections but does not answer "
                f"(no reply to '{what}' in {time.monotonic() - started:.0f}s of retries)",
                "check that DELTABUS_MINIO_ENDPOINT is a healthy MinIO / S3 server (its "
                "logs, disk, load), or allow longer with DELTABUS_RETRY_MAX_WAIT_S",
            ) from None
        except (EndpointConnectionError, BotoConnectionError) as exc:
            raise StorageError(
                f"cannot reach {self.access.describe_store()} ({type(exc).__name__})",
                "start MinIO (`make minio`) or set DELTABUS_MINIO_ENDPOINT to a running server",
            ) from None
        except ClientError as exc:
            if raw_client_errors:
                raise
            raise _client_error(exc, self.access) from None

    def init_bucket(self) -> bool:
        """Create the bucket if needed; returns True when it was created."""
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            return False
        from botocore.exceptions import ClientError

        s = self.settings
        client = self.s3_client(read_timeout=min(10.0, max(1.0, s.retry_max_wait_s / 4)))
        try:
            self._s3(
                lambda: client.create_bucket(Bucket=s.bucket),
                "create the bucket",
                raw_client_errors=True,
            )
            return True
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return False
            raise _client_error(exc, self.access) from None

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

    def settled_delta_or_absent(self, table: str, grace_s: float = NOT_DELTA_GRACE_S) -> bool:
        """`require_delta_or_absent`, giving files without a Delta log `grace_s` to become a
        table: a writer creating one (another producer, say) puts files before its first
        log entry, so only files that stay without a log are an error."""
        deadline = time.monotonic() + grace_s
        while True:
            try:
                return self.require_delta_or_absent(table)
            except StorageError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def latest_version(self, table: str) -> int:
        """The table's newest version, from `_last_checkpoint` and one listing of the log
        after it: two requests, and no table state read, unlike `open(table).version()`.

        Raises:
            StorageError: there is no Delta log at the table's location.
        """
        log_dir = f"{table}/_delta_log"
        newest = -1
        try:
            newest = int(
                json.loads(hedge.get(self.object_store, f"{log_dir}/_last_checkpoint"))["version"]
            )
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError):
            pass  # read mid-overwrite: the listing below starts from the beginning
        offset = f"{log_dir}/{newest:020d}.json" if newest >= 0 else None
        for chunk in obstore.list(self.object_store, log_dir, offset=offset, chunk_size=1000):
            for meta in chunk:
                name = meta["path"].rsplit("/", 1)[-1]
                if len(name) == 25 and name.endswith(".json") and name[:20].isdigit():
                    newest = max(newest, int(name[:20]))
        if newest < 0:
            raise StorageError(
                f"no Delta table at {self.uri(table)}",
                "check DELTABUS_PREFIX / DELTABUS_BUCKET, or create the table first",
            )
        return newest

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


# Error codes of S3 and MinIO that mean the credentials were refused, not the request.
REJECTED_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "InvalidTokenId",
        "ExpiredToken",
        "TokenRefreshRequired",
        "InvalidClientTokenId",
    }
)


def _client_error(exc: Any, access: S3Access) -> StorageError:
    """One boto3 ClientError as a clear StorageError, by its code and status."""
    s = access.settings
    store = access.describe_store()
    error = exc.response.get("Error", {})
    code = error.get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("NoSuchBucket",) or status == 404:
        return StorageError(
            f"bucket '{s.bucket}' does not exist on {store}",
            "create it with `deltabus init-bucket`, or set DELTABUS_BUCKET",
        )
    if code in REJECTED_CREDENTIAL_CODES:
        expired = code in ("ExpiredToken", "TokenRefreshRequired")
        return StorageError(
            f"{store} rejected the credentials: {access.describe_credentials()} ({code}"
            + (": they have expired)" if expired else ")"),
            access.fix_credentials(),
        )
    if code == "AccessDenied" or status == 403:
        return StorageError(
            f"{access.describe_credentials()} may not use bucket '{s.bucket}' ({code or status})",
            "grant the key read/write on the bucket (see README: least-privilege policy)",
        )
    return StorageError(
        f"{store} answered {code or status}: {error.get('Message', '')}",
        "check the store's server logs",
    )
