"""Dagster resources over the deltabus engine: lake storage, MinIO/S3, DuckDB, ETL process.

Every resource resolves the lake from the same settings the engine uses
(`deltabus.core.settings.load_settings`: DELTABUS_* variables, MINIO_S3_* aliases, `.env`), so a
Dagster run, the CLI and the ETL subprocess always agree on where the tables are.
"""

from __future__ import annotations

from resources.duck import delta_views, duckdb_resource
from resources.etl import EtlServiceResource, etl_command
from resources.lake import LakeResource
from resources.opensearch import OpenSearchResource, opensearch_resource
from resources.postgres import PostgresResource, postgres_resource
from resources.s3 import ensure_bucket, list_table_objects, minio_s3_resource


def default_resources() -> dict[str, object]:
    """The resources `definitions.py` binds: everything configured from the environment."""
    return {
        "lake": LakeResource(),
        "s3": minio_s3_resource(),
        "duck": duckdb_resource(),
        "etl_service": EtlServiceResource(),
    }


def serving_resources() -> dict[str, object]:
    """The serving sinks' database (DELTABUS_POSTGRES_DSN) and search cluster
    (DELTABUS_OPENSEARCH_URL), bound by `definitions.py` for served_unified and
    indexed_unified only: a run that does not serve never needs the variables."""
    return {"postgres": postgres_resource(), "opensearch": opensearch_resource()}


__all__ = [
    "EtlServiceResource",
    "LakeResource",
    "OpenSearchResource",
    "PostgresResource",
    "default_resources",
    "serving_resources",
    "delta_views",
    "duckdb_resource",
    "ensure_bucket",
    "etl_command",
    "list_table_objects",
    "minio_s3_resource",
]
