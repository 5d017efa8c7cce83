"""Report to Dagster through Pipes when a Dagster run launched this process.

The engine does not depend on Dagster: `dagster-pipes` is a tiny, dependency-free
package, and without the Pipes environment variables this does nothing.
"""

from __future__ import annotations

import os
from typing import Any


def launched_by_dagster() -> bool:
    return "DAGSTER_PIPES_CONTEXT" in os.environ


def report_to_dagster(metadata: dict[str, Any], asset_key: str | None = None) -> None:
    """Send a materialization with `metadata` to the Dagster run that launched us, if any."""
    if not launched_by_dagster():
        return
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        pipes.report_asset_materialization(metadata=metadata, asset_key=asset_key)
