"""The stream window asset's modes on the real MinIO fixture: batch (producer, then the
ETL) labelled as such, and each half selected on its own."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, minio_settings_for
from tests.helpers import assert_exactly_once


@pytest.fixture
def dagster_lake(minio, tmp_path: Path) -> Iterator[Lake]:
    lake = Lake(minio_settings_for(minio, f"sw-{uuid.uuid4().hex[:10]}"))
    saved = dict(os.environ)
    os.environ.update(lake_env(lake))
    os.environ["DELTABUS_SERVICE_DIR"] = str(tmp_path / "service")
    try:
        yield lake
    finally:
        os.environ.clear()
        os.environ.update(saved)


def window(config: dict, selection: list[str] | None = None):
    from assets.pipeline.assets import stream_window
    from resources import default_resources

    return materialize(
        [stream_window],
        selection=selection,
        resources=default_resources(),
        run_config={"ops": {"stream_window": {"config": config}}},
        instance=DagsterInstance.ephemeral(),
    )


def metadata(result, asset: str) -> dict:
    (mat,) = [
        e.event_specific_data.materialization
        for e in result.get_asset_materialization_events()
        if e.event_specific_data.materialization.asset_key == AssetKey(asset)
    ]
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def test_batch_mode_runs_the_etl_after_the_producer(dagster_lake: Lake):
    result = window({"mode": "batch", "rate": 1000, "duration_s": 1.0})
    assert result.success
    unified = metadata(result, UNIFIED_TABLE)
    assert unified["mode"] == "batch" and unified["rows"] == 1000
    assert_exactly_once(dagster_lake, expected=1000)


def test_inputs_then_the_etl_alone(dagster_lake: Lake):
    inputs = ["timezone1", "timezone2"]
    produced = window({"rate": 1000, "duration_s": 0.5, "run_id": "half"}, inputs)
    assert produced.success
    assert not dagster_lake.exists(UNIFIED_TABLE)
    assert metadata(produced, "timezone1")["producer_run_id"] == "half"
    etl = window({"producers": 1}, [UNIFIED_TABLE])
    assert etl.success and metadata(etl, UNIFIED_TABLE)["mode"] == "etl"
    assert_exactly_once(dagster_lake, expected=500)


def test_an_unknown_mode_is_refused(dagster_lake: Lake):
    with pytest.raises(Exception, match="mode must be one of streaming, batch"):
        window({"mode": "both", "rate": 1000, "duration_s": 0.2})


def test_a_second_streaming_window_waits_for_its_own_producer_run(dagster_lake: Lake):
    """The inputs' history already holds a finished producer run: the second window's ETL
    must not stop at that old finish marker before its own producer has written."""
    first = window({"rate": 1000, "duration_s": 0.5, "run_id": "first"})
    assert first.success and metadata(first, UNIFIED_TABLE)["rows"] == 500
    second = window({"rate": 1000, "duration_s": 1.0, "run_id": "second"})
    assert second.success
    unified = metadata(second, UNIFIED_TABLE)
    assert unified["mode"] == "streaming" and unified["producer_run"] == "second"
    assert unified["rows"] == 1000, unified
    assert_exactly_once(dagster_lake, expected=1500)
