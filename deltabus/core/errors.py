"""Every exception a user of deltabus may catch, and the storage failures a user must fix.

Public through `deltabus.errors`. `DeltabusError` is the base of the errors a user can
fix, printed by the CLI as one clear line; the conflicts between concurrent writers are
plain exceptions. Each class says with `retriable` whether the same call can succeed
when tried again unchanged (the outage passes, the conflicting commit is read): True, or
whether something must change first (settings, input, the user's code, another writer
stopping): False. Callers tell errors apart by type and by `retriable`, never by text.
"""

from __future__ import annotations

import re
import sys


class DeltabusError(Exception):
    """A problem the user can fix: `str()` says what is wrong, `hint` says how to fix it."""

    retriable: bool = False

    def __init__(self, problem: str, hint: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.problem}\n  fix: {self.hint}" if self.hint else self.problem


class ConfigError(DeltabusError):
    """Invalid settings or options."""

    retriable = False


class StorageError(DeltabusError):
    """The lake cannot be reached or used: bucket, credentials, endpoint, not a Delta table."""

    retriable = False


class OffsetOutOfRangeError(DeltabusError):
    """A consumer group's position in a partition table is below the oldest version the
    stream's retention keeps (Kafka's `OffsetOutOfRangeException`): the records between
    were dropped. `table`, `position` and `oldest` say where."""

    retriable = False

    def __init__(self, problem: str, hint: str, *, table: str, position: int, oldest: int):
        super().__init__(problem, hint)
        self.table = table
        self.position = position
        self.oldest = oldest


class MissingExtraError(DeltabusError):
    """A command needs an optional part of deltabus (an extra) that is not installed; the
    message names the extra and the command that installs it."""

    retriable = False


class StoppedDuringOutage(DeltabusError):
    """A stop was requested while storage was unavailable."""

    retriable = True


# -- producers, consumers and writers of a stream ------------------------------------------


class FencedError(DeltabusError):
    """A newer writer claimed the output table: this one must stop without writing."""

    retriable = False


class RecordError(ConfigError):
    """A record does not fit its stream's schema, or its key is unusable."""

    retriable = False


class BufferFullError(DeltabusError):
    """`send` waited `max_block_s` for room in the producer's buffer, in vain."""

    retriable = True


# -- input tables ----------------------------------------------------------------------


class InputTableError(DeltabusError):
    """An input table holds something the tail cannot turn into correct rows."""

    retriable = False


class UnsupportedFeatureError(InputTableError):
    """The input needs a protocol version or feature the tail does not implement."""

    retriable = False


class ChangeWithoutCdfError(InputTableError):
    """A commit removed or rewrote rows in a table without a change data feed."""

    retriable = False


class RemovedFileError(InputTableError):
    """A file a commit names is no longer in storage: vacuumed after it was removed (by
    retention, compaction or a delete) before this reader got to it."""

    retriable = False


class UnreadableFileError(InputTableError):
    """A file an input commit added cannot be read as Parquet: corrupt, truncated or not
    Parquet at all."""

    retriable = False


# -- conflicts between concurrent writers of one table ---------------------------------


class VersionTakenError(Exception):
    """Another writer committed the version this append tried: read it and retry."""

    retriable: bool = True


class CompactionConflict(Exception):
    """A commit that landed first removed an input file or changed the table's schema."""

    retriable: bool = True


class RetentionConflict(Exception):
    """A commit that landed first removed a file retention meant to drop, or changed the
    table's schema: the next pass plans again."""

    retriable: bool = True


# -- serving stores ----------------------------------------------------------------------


class PostgresUnreachable(DeltabusError):
    """No PostgreSQL answers at the DSN's address (nothing listening, or it went away)."""

    retriable = True


class OpenSearchUnreachable(DeltabusError):
    """No OpenSearch answers at the URL's address (nothing listening, or it went away)."""

    retriable = True


class OpenSearchRed(DeltabusError):
    """An index the sink writes to has a primary shard that is not allocated."""

    retriable = True


# Storage failures no retry can cure: the user must free space, grant access or point
# deltabus elsewhere. Told by errno and by botocore's error code where an exception has
# them; otherwise matched as whole tokens (case-insensitive) in the text of any exception
# of a chain, since delta-rs, object_store and Pathway report them only as text inside
# their own errors (S3 error codes, strerror() phrases, Rust's "(os error N)").
_READ_ONLY = ("read-only file system", "readonlyfilesystem", "(os error 30)", "erofs")
_DISK_FULL = (
    "no space left on device",
    "(os error 28)",
    "enospc",
    "kind: storagefull",
    "disk quota exceeded",
    "(os error 122)",
    "quotaexceeded",
)
_MINIO_FULL = (
    "xminiostoragefull",
    "minimum free drive threshold",
    "storage backend has reached",
    "insufficient storage",
)
# Text of an object store's HTTP answer: a full disk it reports is its own drives'.
_OBJECT_STORE_ANSWER = ("s3 error", "server returned", "http://", "https://")
_CREDENTIALS = ("invalidaccesskeyid", "signaturedoesnotmatch", "invalidtoken")
_ACCESS_DENIED = ("accessdenied", "access denied", "access_denied")
_NO_BUCKET = ("nosuchbucket",)
_PERMISSION = ("permission denied", "(os error 13)", "permissiondenied")

_STORE_FULL = (
    (),
    _MINIO_FULL,
    "the object store's drives are full",
    "free space on MinIO's drives or add capacity (e.g. run lake maintenance to vacuum old files)",
)

# (errno values, text markers, problem, fix), tried in this order on each exception.
_USER_STORAGE_FAILURES: tuple[tuple[tuple[int, ...], tuple[str, ...], str, str], ...] = (
    (
        (30,),
        _READ_ONLY,
        "the lake storage is read-only",
        "make it writable (remount it read-write or fix its permissions), or point "
        "DELTABUS_LOCAL_ROOT / DELTABUS_PREFIX at a writable place",
    ),
    (
        (28, 122),
        _DISK_FULL,
        "no space left on the lake storage",
        "free space on that disk (e.g. run lake maintenance to vacuum old files), "
        "or point DELTABUS_LOCAL_ROOT at a disk with room",
    ),
    _STORE_FULL,
    (
        (),
        _CREDENTIALS,
        "the object store rejected the credentials",
        "check DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY (or MINIO_S3_ACCESS_KEY / "
        "MINIO_S3_SECRET_ACCESS_KEY)",
    ),
    (
        (),
        _NO_BUCKET,
        "the bucket does not exist",
        "create it with `deltabus init-bucket`, or set DELTABUS_BUCKET",
    ),
    (
        (),
        _ACCESS_DENIED,
        "the object store denied access",
        "grant the access key read/write on the bucket (README, Security: "
        "s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject)",
    ),
    (
        (1, 13),
        _PERMISSION,
        "permission denied",
        "give this user write access to that path, or point DELTABUS_LOCAL_ROOT "
        "(or --out) at a writable place",
    ),
)


def _tokens(markers: tuple[str, ...]) -> re.Pattern[str]:
    """A pattern finding any of `markers` as a whole token: not inside a longer word."""
    alternatives = [
        ("\\b" if m[0].isalnum() else "") + re.escape(m) + ("\\b" if m[-1].isalnum() else "")
        for m in markers
    ]
    return re.compile("|".join(alternatives), re.IGNORECASE)


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}


def _found(markers: tuple[str, ...], text: str) -> bool:
    if not markers:
        return False
    if (pattern := _PATTERNS.get(markers)) is None:
        pattern = _PATTERNS[markers] = _tokens(markers)
    return pattern.search(text) is not None


def _code(exc: BaseException) -> str:
    """The error code an exception carries as data (botocore's S3 answer), else ""."""
    boto = sys.modules.get("botocore.exceptions")
    if boto is not None and isinstance(exc, boto.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception it was raised from or during (causes, contexts, groups)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo.extend([e.__cause__, e.__context__])  # type: ignore[list-item]
        todo.extend(getattr(e, "exceptions", None) or ())
    return seen


def _excerpt(exc: BaseException) -> str:
    """The first line of an error, shortened: enough to name the path or the request."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def user_storage_error(exc: BaseException, where: str = "") -> DeltabusError | None:
    """The one clear error for a storage failure a user must fix, found anywhere in the
    exception chain of `exc` (read-only or full storage, access denied, ...); None when
    nothing in the chain is one. `where` names the lake, for the message.
    """
    chain = exception_chain(exc)
    for e in chain:
        if isinstance(e, DeltabusError):
            return e
    at = f" ({where})" if where else ""
    for e in chain:
        text = f"{type(e).__name__}: {e}"
        errno = getattr(e, "errno", None)
        code = _code(e)
        for errnos, markers, problem, hint in _USER_STORAGE_FAILURES:
            if errno in errnos or code.lower() in markers or _found(markers, text):
                if markers is _DISK_FULL and _found(_OBJECT_STORE_ANSWER, text):
                    # The object store ran out of disk ("no space left on device" in
                    # its answer): its drives need room, not our local root.
                    _, _, problem, hint = _STORE_FULL
                return StorageError(f"{problem}{at}: {_excerpt(e)}", hint)
    return None
