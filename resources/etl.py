"""The continuous ETL service as a Dagster resource (bounded runs: assets.pipeline.assets)."""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field

from deltabus.apps.timezones.etl.command import etl_command
from deltabus.apps.timezones.service import EtlService, EtlServiceGroup
from deltabus.core.intervals import DEFAULT_COMMIT_INTERVAL_MS, DEFAULT_POLL_INTERVAL_MS, from_ms

# Raised by Dagster's own Pipes session code on every run, not by anything called here.
PIPES_INTERNAL_WARNING = r".*PipesMessageReader\.expected_writer_count.*"


class EtlServiceResource(ConfigurableResource):
    """The continuous ETL service (`apps.timezones.service.EtlService`) and how to run it."""

    state_dir: str | None = Field(
        default=None,
        description="pid/log/state directory; default $DELTABUS_SERVICE_DIR, "
        "$DAGSTER_HOME/../deltabus-service or .deltabus/service.",
    )
    commit_interval_ms: float = Field(
        default=DEFAULT_COMMIT_INTERVAL_MS, description="Unified commit interval (ms)."
    )
    poll_interval_ms: float = Field(
        default=DEFAULT_POLL_INTERVAL_MS, description="Input polling interval (ms)."
    )
    processes: int = Field(
        default=1,
        description="ETL processes of the service; with P partitions per stream (1..P), "
        "process j owns partitions i with i mod processes == j.",
    )
    lag_limit_s: float = Field(
        default=30.0,
        description="The etl_lag_within_limit check fails when timezone_unified is further "
        "behind the inputs than this (seconds).",
    )

    def service(self) -> EtlService | EtlServiceGroup:
        if self.processes > 1:
            return EtlServiceGroup(self.state_dir, self.processes)
        return EtlService(self.state_dir)

    def etl_args(self) -> list[str]:
        """The service's interval options (checked here, before anything starts)."""
        command = etl_command(
            "continuous",
            commit_interval=from_ms(self.commit_interval_ms),
            poll_interval=from_ms(self.poll_interval_ms, "poll interval"),
            as_json=False,
        )
        return command[command.index("continuous") + 1 :]
