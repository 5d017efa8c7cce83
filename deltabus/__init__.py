"""deltabus: Delta Lake tables on S3-compatible storage as a streaming backbone.

The public API: `connect()` a lake, declare streams on it, produce and consume them.

    bus = deltabus.connect()
    bus.create_stream("orders", schema, partitions=4, key="customer")
    with bus.producer("orders", "checkout-1") as producer:
        producer.send({"order_id": 1, ...})
    with bus.consumer("orders", group="billing") as consumer:
        for batch in consumer: ...

Public besides the names below: `deltabus.connectors.pathway` (Pathway, no licence key),
`deltabus.delta.lake` (the `Lake` handle), `deltabus.delta.tables` (creating tables with
deltabus' properties, reading commit metadata), `deltabus.errors` (every exception a user
may catch, each with `retriable`; also exported here) and `deltabus.core` (settings,
storage retries). The time-zone application uses nothing else (checked by `make lint`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from deltabus.core.version import __version__ as __version__

# Every exception a user may catch (deltabus.errors, light to import) is exported here too.
from deltabus.errors import *  # noqa: F403
from deltabus.errors import __all__ as _errors

__all__ = [
    "Batch",
    "Bus",
    "Consumer",
    "Lake",
    "MAX_PARTITIONS",
    "Producer",
    "Source",
    "Stream",
    "StreamPartition",
    "StreamSettings",
    "Transform",
    "TransformGroup",
    "connect",
    "key_partition",
    "partition_table",
    "position_marker",
    "recorded_marks",
    *_errors,
]

# Imported on first use, so that `import deltabus` stays light for the CLI.
_HOMES = {
    "Batch": "deltabus.bus.consumer",
    "Bus": "deltabus.bus.client",
    "Consumer": "deltabus.bus.consumer",
    "Lake": "deltabus.delta.lake",
    "MAX_PARTITIONS": "deltabus.bus.partitions",
    "Producer": "deltabus.bus.producer",
    "recorded_marks": "deltabus.bus.producer",
    "StreamPartition": "deltabus.bus.consumer",
    "Source": "deltabus.bus.transform",
    "Stream": "deltabus.bus.streams",
    "StreamSettings": "deltabus.bus.streams",
    "Transform": "deltabus.bus.transform",
    "TransformGroup": "deltabus.bus.transform",
    "connect": "deltabus.bus.client",
    "key_partition": "deltabus.bus.partitioning",
    "partition_table": "deltabus.bus.partitions",
    "position_marker": "deltabus.bus.positions",
}

if TYPE_CHECKING:
    from deltabus.bus.client import Bus, connect
    from deltabus.bus.consumer import Batch, Consumer, StreamPartition
    from deltabus.bus.partitioning import key_partition
    from deltabus.bus.partitions import MAX_PARTITIONS, partition_table
    from deltabus.bus.positions import position_marker
    from deltabus.bus.producer import Producer, recorded_marks
    from deltabus.bus.streams import Stream, StreamSettings
    from deltabus.bus.transform import Source, Transform, TransformGroup
    from deltabus.delta.lake import Lake


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'deltabus' has no attribute {name!r}")
    return getattr(import_module(home), name)
