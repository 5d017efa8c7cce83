"""The OpenSearch the index sink writes to, as a Dagster resource.

The URL may hold a password, so the resource takes it as an `EnvVar`
(DELTABUS_OPENSEARCH_URL, the engine's own setting): the UI and the run config show the
variable's name, never its value. Without the variable, a run that needs it fails with
Dagster's "environment variable DELTABUS_OPENSEARCH_URL is not set" (`deltabus
opensearch up` writes it to .env).
"""

from __future__ import annotations

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.opensearch_documents import DEFAULT_INDEX, check_index_name

URL_VAR = osc.URL_VAR


class OpenSearchResource(ConfigurableResource):
    """Where the unified stream is indexed: an OpenSearch cluster and an index in it."""

    url: str = Field(description="OpenSearch URL (give it as EnvVar: it may hold a password).")
    index: str = Field(default=DEFAULT_INDEX, description="The served index.")

    def served_index(self) -> str:
        return check_index_name(self.index)

    def describe(self) -> str:
        """The index and scheme://user@host:port, never the password."""
        return f"{self.served_index()} on {osc.describe(self.url)}"


def opensearch_resource() -> OpenSearchResource:
    """The resource `definitions.py` binds: the URL from DELTABUS_OPENSEARCH_URL."""
    return OpenSearchResource(url=EnvVar(URL_VAR))
