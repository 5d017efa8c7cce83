"""`deltabus opensearch up/down`: a persistent local OpenSearch node for development.

`up` with no DELTABUS_OPENSEARCH_URL configured starts a node from the data directory on
a free port of 127.0.0.1 and appends its URL to `.env`, as `deltabus postgres up` does
for its DSN. With a URL configured it starts the node of that directory again on the
URL's port, or only checks that the configured node answers.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from deltabus.adapters.dev.opensearch_process import PORT_FILE, OpenSearchNode, http_json, stop_pid
from deltabus.adapters.dev.server import LOCAL_HOSTS
from deltabus.adapters.serving import opensearch_connection as osc
from deltabus.adapters.serving.settings import load_serving_settings
from deltabus.core.errors import ConfigError
from deltabus.core.settings import append_env_file


def _write_url(env_file: Path | None, url: str) -> Path:
    return append_env_file(
        env_file,
        [
            "# written by `deltabus opensearch up`: the local development OpenSearch",
            f"{osc.URL_VAR}={url}",
        ],
    )


def _answers(url: str) -> bool:
    """True when an OpenSearch node answers at `url` (no credentials: a local node)."""
    return http_json(f"{osc.parse(url).endpoint}/") is not None


def opensearch_up(env_file: Path | None, data_dir: Path) -> str:
    """Start (or find) the development OpenSearch node; returns what was done."""
    data_dir = data_dir.resolve()
    configured = load_serving_settings(env_file).opensearch_url
    if configured is None:
        node = OpenSearchNode(data_dir).start()
        written = _write_url(env_file, node.url)
        return f"{node.describe()} started (pid {node.process.pid}); URL written to {written}"  # type: ignore[union-attr]
    url = configured.get_secret_value()
    parts = urlsplit(osc.parse(url).endpoint)
    if _answers(url):
        return f"{osc.describe(url)} is running"
    if parts.hostname not in LOCAL_HOSTS or not (data_dir / PORT_FILE).is_file():
        raise ConfigError(
            f"nothing answers at {osc.describe(url)}, and {data_dir} holds no local node",
            f"start that node, or remove the {osc.URL_VAR} line from .env to start a local one",
        )
    node = OpenSearchNode(data_dir, port=parts.port).start()
    return f"{node.describe()} started (pid {node.process.pid})"  # type: ignore[union-attr]


def opensearch_down(data_dir: Path) -> str:
    """Stop the development OpenSearch node of `data_dir` (its pid file)."""
    pid = stop_pid(data_dir.resolve())
    if pid is None:
        return f"no OpenSearch running from {data_dir}"
    return f"stopped OpenSearch (pid {pid})"
