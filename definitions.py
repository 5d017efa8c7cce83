"""The Dagster code location of deltabus (loaded by workspace.yaml, or `-m definitions`).

    dagster dev                                        # UI + daemon, from the repo root
    dagster job execute -m definitions -j pipeline_job
    dagster asset materialize -m definitions --select timezone1,timezone2,timezone_unified

Settings come from DELTABUS_* environment variables and `.env` (see README.md); the
resources never show a secret in the UI or the logs.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import Definitions, load_from_defs_folder
from dotenv import load_dotenv

from deltabus.core.processes import apply_process_defaults
from resources import default_resources, serving_resources

PROJECT_ROOT = Path(__file__).resolve().parent

apply_process_defaults()
# Like `dagster dev`, read ./.env (or $DELTABUS_ENV_FILE) so the S3 resource's EnvVars
# resolve the same way the engine's settings do; variables already set win.
load_dotenv(os.environ.get("DELTABUS_ENV_FILE") or ".env", override=False)


def build_definitions(resources: dict[str, object] | None = None) -> Definitions:
    """Every definition of the defs folder (`assets/`, named by `[tool.dg.project]` in
    pyproject.toml) with the resources; `resources` replaces the environment-configured
    defaults (tests)."""
    return Definitions.merge(
        load_from_defs_folder(path_within_project=PROJECT_ROOT),
        Definitions(resources={**default_resources(), **serving_resources(), **(resources or {})}),
    )


defs = build_definitions()
