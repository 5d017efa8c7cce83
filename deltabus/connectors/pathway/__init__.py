"""Pathway on deltabus, with no licence key.

`Link` runs a Pathway program from one declared stream to another, exactly once, fenced.
For other inputs and outputs: `TableTail` is the input every deltabus Pathway source
builds on (one Delta table tailed, one GET per poll), and `TableSink` the exactly-once
output, writing an `Output` that `open_output` created, claimed and read the positions
of. `TableTail.emit` gets the table's `deltabus.bus.tail.DeltaLogTail` and its new
`deltabus.bus.tail.Commit`s (`deltabus.delta.table_files.concat` and `without_views` shape
the rows it reads). The time-zone ETL is built on these.
"""

from deltabus.connectors.pathway.link import Link, StreamBatch
from deltabus.connectors.pathway.output import Output, open_output
from deltabus.connectors.pathway.sink import Received, TableSink
from deltabus.connectors.pathway.tail import TableTail

__all__ = [
    "Link",
    "Output",
    "Received",
    "StreamBatch",
    "TableSink",
    "TableTail",
    "open_output",
]
