"""The ETL process: bounded runs through Dagster Pipes, the continuous one as a service."""

from __future__ import annotations

import sys
from pathlib import Path

from dagster import ConfigurableResource, PipesSubprocessClient
from pydantic import Field

from deltabus.service import EtlService

REPO_ROOT = Path(__file__).resolve().parents[1]

# Raised by Dagster's own Pipes session code on every run, not by anything called here.
PIPES_INTERNAL_WARNING = r".*PipesMessageReader\.expected_writer_count.*"


def etl_command(mode: str = "bounded", *args: str) -> list[str]:
    """`python -m deltabus --json etl --mode MODE ARGS` with this interpreter."""
    return [sys.executable, "-m", "deltabus", "--json", "etl", "--mode", mode, *args]


def pipes_subprocess_client() -> PipesSubprocessClient:
    """Runs the ETL as its own process; its stderr log lines go to the run's compute logs
    and the metadata it reports (`deltabus.pipes.report_to_dagster`) to the materialization."""
    return PipesSubprocessClient(cwd=str(REPO_ROOT), forward_stdio=True)


class EtlServiceResource(ConfigurableResource):
    """The continuous ETL service (`deltabus.service.EtlService`) and how to run it."""

    state_dir: str | None = Field(
        default=None,
        description="pid/log/state directory; default $DELTABUS_SERVICE_DIR, "
        "$DAGSTER_HOME/../deltabus-service or .deltabus/service.",
    )
    commit_interval_ms: float = Field(default=100, description="Unified commit interval.")
    poll_interval_ms: float = Field(default=20, description="Input polling interval.")

    def service(self) -> EtlService:
        return EtlService(self.state_dir)

    def etl_args(self) -> list[str]:
        return [
            "--commit-interval-ms",
            f"{self.commit_interval_ms:g}",
            "--poll-interval-ms",
            f"{self.poll_interval_ms:g}",
        ]
