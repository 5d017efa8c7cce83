"""Small helpers shared by the assets, checks and sensors."""

from typing import Any

import pyarrow as pa
from dagster import DynamicPartitionsDefinition, TableColumn, TableSchema
from deltalake import DeltaTable

# One group for the flow, so the UI shows its whole lineage expanded on one page.
PIPELINE_GROUP = "pipeline"
BENCHMARK_GROUP = "benchmark"
# Who answers for the assets (the UI's owner filter).
OWNERS = ["team:data-platform"]
# Steps whose latency figures another such step would skew on a 2-core machine (the stream
# window, the benchmark): the pool's limit (1 by default, platform/dagster.yaml) serializes them.
MEASURED_POOL = "measured"
# One partition per producer run (its run id): latency and checks are computed once per run.
PRODUCER_RUNS = DynamicPartitionsDefinition(name="producer_runs")


def column_schema(schema: pa.Schema, descriptions: dict[str, str] | None = None) -> TableSchema:
    """A table contract (deltabus.delta.tables) as Dagster's `dagster/column_schema`."""
    return TableSchema(
        columns=[
            TableColumn(f.name, str(f.type), description=(descriptions or {}).get(f.name))
            for f in schema
        ]
    )


def table_rows(dt: DeltaTable) -> int:
    """Rows in the current version, from the Delta log's file statistics (no data read)."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0 or "num_records" not in actions.column_names:
        return 0
    return int(pa.compute.sum(actions["num_records"]).as_py() or 0)


def markdown_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A GitHub-style Markdown table of `rows` (for MetadataValue.md)."""
    if not rows:
        return "_none_"
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")
