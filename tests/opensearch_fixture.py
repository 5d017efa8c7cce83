"""A real OpenSearch for the tests: DELTABUS_TEST_OPENSEARCH_URL, else an embedded node on
loopback (deltabus.adapters.dev.opensearch_process), its jars fetched with Maven into the cache when
missing. In CI a missing OpenSearch (no Java, jars that cannot be fetched) is a failure,
never a skip. The serving setting DELTABUS_OPENSEARCH_URL is never read here
(tests/conftest.py removes it): a user's cluster is used only when named by
DELTABUS_TEST_OPENSEARCH_URL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from deltabus.adapters.dev.opensearch_process import OpenSearchNode, fetch_jars
from deltabus.core.errors import DeltabusError

IN_CI = os.environ.get("CI", "").lower() == "true"
TEST_URL_VAR = "DELTABUS_TEST_OPENSEARCH_URL"


@dataclass
class OpenSearch:
    url: str  # may hold a password: pass it to children's environments only
    node: OpenSearchNode | None  # None: an existing cluster named by TEST_URL_VAR


def require_opensearch_jars() -> None:
    """Skip (fail in CI) when the embedded node's jars are not cached and cannot be fetched."""
    try:
        fetch_jars()
    except DeltabusError as exc:
        message = f"no OpenSearch node can be started: {exc}"
        if IN_CI:
            pytest.fail(f"OpenSearch is required in CI: {message}")
        pytest.skip(f"{message}; or set {TEST_URL_VAR}")


def start_node() -> OpenSearchNode:
    require_opensearch_jars()
    try:
        return OpenSearchNode().start()
    except DeltabusError as exc:
        if IN_CI:
            pytest.fail(f"OpenSearch is required in CI: {exc}")
        pytest.skip(f"the OpenSearch node did not start: {exc}")


@pytest.fixture(scope="session")
def opensearch() -> Iterator[OpenSearch]:
    """One OpenSearch for the whole session (tests use their own index names)."""
    url = os.environ.get(TEST_URL_VAR)
    if url:
        yield OpenSearch(url, None)
        return
    node = start_node()
    try:
        yield OpenSearch(node.url, node)
    finally:
        node.cleanup()


@pytest.fixture
def own_opensearch() -> Iterator[OpenSearchNode]:
    """An OpenSearch node of this test's own, for tests that stop and restart it."""
    node = start_node()
    try:
        yield node
    finally:
        node.cleanup()
