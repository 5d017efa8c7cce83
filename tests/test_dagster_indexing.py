"""The indexed_unified asset and its checks, against a real lake and a real OpenSearch."""

from __future__ import annotations

import uuid

import pytest
from dagster import AssetKey, AssetSelection, EnvVar, materialize

from assets.serving.opensearch import INDEXED_ASSET, INDEXING_CHECKS, indexed_unified
from deltabus.delta.lake import Lake
from resources.lake import LakeResource
from resources.opensearch import OpenSearchResource, opensearch_resource
from tests.conftest import use_lake_env
from tests.opensearch_fixture import OpenSearch
from tests.test_serve_postgres import UnifiedWriter


def metadata(result) -> dict:  # noqa: ANN001 - an ExecuteInProcessResult
    (mat,) = result.asset_materializations_for_node(INDEXED_ASSET)
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def checks(result) -> dict:  # noqa: ANN001
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_asset_indexes_and_checks_tell_when_it_is_behind(
    minio_lake: Lake, opensearch: OpenSearch, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_lake_env(monkeypatch, minio_lake)
    writer = UnifiedWriter(minio_lake)
    writer.commit([(f"m{i}", float(i), 1) for i in range(50)] + [("nul\x00m", 50.0, 1)])
    version = writer.commit([("m0", 0.0, -1), ("m1", 1.0, -1), ("m1", 1.25, 1)])
    resources = {
        "lake": LakeResource(),
        "opensearch": OpenSearchResource(
            url=opensearch.url, index=f"indexed-{uuid.uuid4().hex[:8]}"
        ),
    }
    everything = [indexed_unified, *INDEXING_CHECKS]

    result = materialize(everything, resources=resources)
    assert result.success
    meta = metadata(result)
    assert meta["dagster/row_count"] == 50 and meta["version"] == version
    assert meta["lag_s"] >= 0 and meta["unified_version"] == version
    assert all(e.passed for e in checks(result).values()), checks(result)

    # The unified table moves on; the checks alone (no materialization) see it.
    writer.commit([("m2", 2.0, -1), ("late", 99.0, 1), ("later", 100.0, 1)])
    behind = materialize(
        everything,
        resources=resources,
        selection=AssetSelection.checks(*INDEXING_CHECKS),
        raise_on_error=False,
    )
    found = checks(behind)
    assert not found["indexed_count_matches_unified"].passed
    assert not found["indexed_messages_match_unified"].passed
    assert found["indexed_messages_match_unified"].metadata["missing"].value == 2
    assert found["indexed_messages_match_unified"].metadata["extra"].value == 1
    assert found["indexed_lag_within_limit"].metadata["versions_behind"].value == 1

    caught_up = materialize(everything, resources=resources)
    assert caught_up.success and metadata(caught_up)["dagster/row_count"] == 51
    assert all(e.passed for e in checks(caught_up).values())
    assert caught_up.get_asset_check_evaluations()[0].asset_key == AssetKey(INDEXED_ASSET)


def test_resource_takes_the_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELTABUS_OPENSEARCH_URL", "https://u:hidden-pw@127.0.0.1:9299")
    resource = opensearch_resource()
    assert resource.url == EnvVar("DELTABUS_OPENSEARCH_URL")  # the UI shows the name only
    assert "hidden-pw" not in repr(resource)
    assert OpenSearchResource(url="https://u:hidden-pw@127.0.0.1:9299").describe() == (
        "indexed_unified on OpenSearch https://u@127.0.0.1:9299"
    )
