"""Where the repository's platform scripts are: they fetch the jars of Kafka, Spark and
OpenSearch, which a source checkout runs and the wheel does not ship."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def platform_script(name: str) -> Path:
    """The script `platform/<name>` of the checkout this package runs from."""
    return REPO_ROOT / "platform" / name
