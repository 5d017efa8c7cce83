"""Pathway on deltabus, with no licence key.

`Link` runs a Pathway program from one declared stream to another, exactly once;
`TableTail` is the input every deltabus Pathway source builds on (the time-zone ETL's
included): one Delta table tailed, one GET per poll.
"""

from deltabus.connectors.pathway.link import Link, StreamBatch
from deltabus.connectors.pathway.tail import TableTail

__all__ = ["Link", "StreamBatch", "TableTail"]
