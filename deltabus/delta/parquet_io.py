"""How deltabus writes Parquet: data files of every table it appends to, and checkpoints.

Arrow's writer dictionary-encodes every column until a column's dictionary reaches
1 MiB. A stream's columns are mostly unique per row (message ids, local times, epoch
stamps), so that spends the writer's CPU on dictionaries it then throws away, more so
with several writer threads at once (docs/design/checkpoints.md). A 16 KiB dictionary
limit keeps the encoding for the columns where it pays (a few hundred distinct values,
such as `diff`) and gives up on the others after a few hundred rows.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

DICTIONARY_PAGE_LIMIT = 16 << 10


def parquet_buffer(table: pa.Table) -> pa.Buffer:
    """`table` as one Snappy-compressed Parquet file in memory."""
    sink = pa.BufferOutputStream()
    pq.write_table(
        table, sink, compression="snappy", dictionary_pagesize_limit=DICTIONARY_PAGE_LIMIT
    )
    return sink.getvalue()
