"""Connecting to OpenSearch: the URL as a secret, one clear error for what a user must fix.

The URL may carry `user:password@`, so it is never printed: `describe` names scheme,
user, host and port only, and `redact` removes the password (and the URL) from any text
that reaches a user. Failures are sorted by the client's exception class and the HTTP
status OpenSearch answered with (never by words in a message): rejected credentials,
denied privileges, a failed TLS handshake, an unreachable node or a red index at start
are `DeltabusError`s (exit 2); a node that goes away mid-stream, 429 and 5xx answers
are transient and retried.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from deltabus.core.errors import ConfigError, DeltabusError
from deltabus.core.errors import OpenSearchRed as OpenSearchRed
from deltabus.core.errors import OpenSearchUnreachable as OpenSearchUnreachable
from deltabus.core.retry import transient_status

log = logging.getLogger(__name__)

URL_VAR = "DELTABUS_OPENSEARCH_URL"
REQUEST_TIMEOUT_S = 60  # a bulk with refresh=wait_for waits up to one refresh interval
# The error type OpenSearch gives a write refused by an index or cluster block (403):
# a disk past the flood stage, or index.blocks.write.
BLOCKED = "cluster_block_exception"


@dataclass(frozen=True)
class OpenSearchUrl:
    """A parsed URL: where to connect (no credentials) and the credentials apart."""

    endpoint: str  # scheme://host:port, what the client connects to
    user: str | None
    password: str | None

    def describe(self) -> str:
        scheme, rest = self.endpoint.split("://", 1)
        return f"OpenSearch {scheme}://{self.user + '@' if self.user else ''}{rest}"


def parse(url: str) -> OpenSearchUrl:
    """The URL's parts; ConfigError, without the URL, when it is not http(s)://HOST:PORT."""
    invalid = ConfigError(
        f"{URL_VAR} (or --url) is not a valid OpenSearch URL",
        "use http://HOST:PORT or https://USER:PASSWORD@HOST:PORT",
    )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise invalid from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise invalid
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = 443 if parts.scheme == "https" else 9200
    return OpenSearchUrl(
        endpoint=f"{parts.scheme}://{host}:{port or default}",
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def describe(url: str) -> str:
    """OpenSearch scheme://user@host:port, never the password."""
    return parse(url).describe()


def redact(text: str, url: str | None) -> str:
    """`text` without the URL or its password."""
    if not url:
        return text
    secrets = {url}
    try:
        parts = parse(url)
        if parts.password:
            secrets.add(parts.password)
            secrets.add(urlsplit(url).password or "")  # as written in the URL (%-encoded)
    except ConfigError:
        pass
    secrets.discard("")
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


# Connections kept open: one per bulk request the sink keeps in flight, plus its position
# reads and writes (urllib3's default of one reconnects for every concurrent request).
POOL_MAXSIZE = 16


def client(url: str) -> Any:
    """An `opensearchpy.OpenSearch` client for `url`: no retries of its own (the sink's
    retry budget decides), credentials as HTTP basic auth."""
    from opensearchpy import OpenSearch

    # The client logs every answer >= 400 as a warning (a 409 of a replayed write, a 404
    # of a fresh sink's position, with a traceback when nothing answered); the sink says
    # what matters once, in its own words.
    logging.getLogger("opensearch").setLevel(logging.ERROR)
    parts = parse(url)
    auth = (parts.user, parts.password or "") if parts.user is not None else None
    return OpenSearch(
        hosts=[parts.endpoint],
        http_auth=auth,
        timeout=REQUEST_TIMEOUT_S,
        max_retries=0,
        retry_on_timeout=False,
        http_compress=False,
        pool_maxsize=POOL_MAXSIZE,
    )


class BulkItemsFailed(Exception):
    """Some operations of a bulk request failed: `statuses` are their HTTP statuses,
    `first` the first failure's type and reason."""

    def __init__(self, statuses: list[int], first: str) -> None:
        super().__init__(f"{len(statuses)} bulk operations failed, first: {first}")
        self.statuses = statuses
        self.first = first


# Error types of a multi-get item whose shard is not serving yet (a node recovering after
# a restart, a relocation): the document's state is unknown, and will be known.
UNAVAILABLE_SHARD_TYPES = frozenset(
    {
        "no_shard_available_action_exception",
        "unavailable_shards_exception",
        "shard_not_found_exception",
        "primary_missing_action_exception",
    }
)


class ItemReadsFailed(Exception):
    """Some documents of a multi-get could not be read: `types` are OpenSearch's error
    types for them, `first` the first failure's type and reason."""

    def __init__(self, types: list[str], first: str) -> None:
        super().__init__(f"{len(types)} documents could not be read, first: {first}")
        self.types = types
        self.first = first


def status_of(exc: BaseException) -> int | None:
    """The HTTP status OpenSearch answered `exc` with (None: no answer at all)."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def is_transient(exc: BaseException) -> bool:
    """True for failures an OpenSearch outage explains (it will come back): no answer
    (connection refused, reset, timed out), 408, 429 and 5xx answers, bulk operations
    that failed only with those, and document reads that failed only on shards not
    serving yet."""
    from opensearchpy.exceptions import ConnectionError as NoAnswer
    from opensearchpy.exceptions import SSLError, TransportError

    if isinstance(exc, DeltabusError):
        return False
    if isinstance(exc, BulkItemsFailed):
        return all(transient_status(s) for s in exc.statuses)
    if isinstance(exc, ItemReadsFailed):
        return all(t in UNAVAILABLE_SHARD_TYPES for t in exc.types)
    if isinstance(exc, SSLError):
        return False
    if isinstance(exc, NoAnswer):
        return True
    if isinstance(exc, TransportError):
        status = status_of(exc)
        return status is not None and transient_status(status)
    return False


def _first_line(exc: BaseException, url: str) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0] if text else type(exc).__name__, url)[:300]


def user_error(exc: BaseException, url: str) -> DeltabusError | None:
    """The one clear error for an OpenSearch failure a user must fix, or None."""
    from opensearchpy.exceptions import (
        AuthenticationException,
        AuthorizationException,
        SSLError,
    )
    from opensearchpy.exceptions import ConnectionError as NoAnswer

    if isinstance(exc, DeltabusError):
        return exc
    where = describe(url)
    if isinstance(exc, AuthenticationException):
        return ConfigError(
            f"OpenSearch rejected the credentials ({where})",
            f"check the user and password in {URL_VAR} (or --url)",
        )
    if isinstance(exc, AuthorizationException):
        if getattr(exc, "error", None) == BLOCKED:
            return DeltabusError(
                f"OpenSearch refuses writes to the index ({where}): {_first_line(exc, url)}",
                "free disk space on the OpenSearch nodes (past the flood stage indices are "
                "blocked), or remove the index's write block",
            )
        return ConfigError(
            f"OpenSearch denied the sink's user ({where})",
            "grant the user create_index, write and read on the served index and on "
            "deltabus_sink_position, and cluster:monitor/health",
        )
    if isinstance(exc, SSLError):
        return ConfigError(
            f"the TLS handshake with {where} failed: {_first_line(exc, url)}",
            f"check http:// versus https:// in {URL_VAR} and that this machine trusts the "
            "node's certificate",
        )
    if isinstance(exc, NoAnswer):
        return OpenSearchUnreachable(
            f"cannot reach {where}: {_first_line(exc, url)}",
            f"start OpenSearch (deltabus opensearch up), or point {URL_VAR} (or --url) at a "
            "running node",
        )
    return None


def check_usable(os_client: Any, url: str, indices: list[str]) -> None:
    """One request to the node and one to cluster health; the one clear error when the
    node cannot be used: not reachable, credentials rejected, or one of `indices` red.
    A red index elsewhere in the cluster is logged and left alone."""
    try:
        os_client.info()
        health = os_client.cluster.health(level="indices")
    except Exception as exc:
        error = user_error(exc, url)
        if error is not None:
            raise error from None
        raise
    if health.get("status") != "red":
        return
    red = sorted(
        name for name, index in (health.get("indices") or {}).items() if index["status"] == "red"
    )
    ours = [name for name in red if name in indices]
    if ours:
        raise OpenSearchRed(
            f"the OpenSearch cluster {health.get('cluster_name')!r} is red ({describe(url)}): "
            f"index {', '.join(ours)} has a primary shard that is not allocated",
            "bring back the node that held it (GET _cluster/allocation/explain says why it "
            "is unassigned), or delete the index and the sink's document in "
            "deltabus_sink_position to load it afresh",
        )
    log.warning(
        "the OpenSearch cluster is red (indices %s); the sink's indices are not affected",
        ", ".join(red) or "unknown",
    )
