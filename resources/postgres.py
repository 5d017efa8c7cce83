"""The PostgreSQL the serving sink writes to, as a Dagster resource.

The DSN holds a password, so the resource takes it as an `EnvVar` (DELTABUS_POSTGRES_DSN,
the engine's own setting): the UI and the run config show the variable's name, never its
value. Without the variable, a run that needs it fails with Dagster's "environment
variable DELTABUS_POSTGRES_DSN is not set" (`make postgres` writes it to .env).
"""

from __future__ import annotations

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from deltabus.adapters.serving import pg
from deltabus.adapters.serving.postgres_target import DEFAULT_TABLE, check_table_name

DSN_VAR = "DELTABUS_POSTGRES_DSN"


class PostgresResource(ConfigurableResource):
    """Where the unified stream is served: a PostgreSQL database and a table in it."""

    dsn: str = Field(
        description="libpq connection string (give it as EnvVar: it holds a password)."
    )
    table: str = Field(default=DEFAULT_TABLE, description="The served table.")

    def served_table(self) -> str:
        return check_table_name(self.table)

    def describe(self) -> str:
        """user@host:port/database and the table, never the password."""
        return f"{self.served_table()} on {pg.describe(self.dsn)}"


def postgres_resource() -> PostgresResource:
    """The resource `definitions.py` binds: the DSN from DELTABUS_POSTGRES_DSN."""
    return PostgresResource(dsn=EnvVar(DSN_VAR))
