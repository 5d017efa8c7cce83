"""The Dagster code location of deltabus (loaded by workspace.yaml, or `-m definitions`).

    dagster dev                                        # UI + daemon, from the repo root
    dagster job execute -m definitions -j pipeline_job
    dagster asset materialize -m definitions --select timezone1,timezone2,timezone_unified

Settings come from DELTABUS_* environment variables and `.env` (see README.md); the
resources never show a secret in the UI or the logs.
"""

from __future__ import annotations

import os

from dagster import Definitions
from dotenv import load_dotenv

from assets import ASSET_CHECKS, ASSETS, JOBS, SCHEDULES, SENSORS
from deltabus.processes import apply_process_defaults
from resources import default_resources, serving_resources

apply_process_defaults()
# Like `dagster dev`, read ./.env (or $DELTABUS_ENV_FILE) so the S3 resource's EnvVars
# resolve the same way the engine's settings do; variables already set win.
load_dotenv(os.environ.get("DELTABUS_ENV_FILE") or ".env", override=False)


def build_definitions(resources: dict[str, object] | None = None) -> Definitions:
    """All definitions; `resources` replaces the environment-configured defaults (tests)."""
    return Definitions(
        assets=ASSETS,
        asset_checks=ASSET_CHECKS,
        jobs=JOBS,
        sensors=SENSORS,
        schedules=SCHEDULES,
        resources={**default_resources(), **serving_resources(), **(resources or {})},
    )


defs = build_definitions()
