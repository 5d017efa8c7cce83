"""Serving the unified stream: PostgreSQL and OpenSearch, each an asset with its checks."""
