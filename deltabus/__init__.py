"""deltabus: Delta Lake tables on S3-compatible storage as a streaming backbone.

The public API: `connect()` a lake, declare streams on it, produce and consume them.

    bus = deltabus.connect()
    bus.create_stream("orders", schema, partitions=4, key="customer")
    with bus.producer("orders", "checkout-1") as producer:
        producer.send({"order_id": 1, ...})
    with bus.consumer("orders", group="billing") as consumer:
        for batch in consumer: ...
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from deltabus.core.version import __version__ as __version__

__all__ = [
    "Batch",
    "Bus",
    "ConfigError",
    "Consumer",
    "DeltabusError",
    "Producer",
    "RecordError",
    "StorageError",
    "Source",
    "Stream",
    "StreamSettings",
    "Transform",
    "connect",
]

# Imported on first use, so that `import deltabus` stays light for the CLI.
_HOMES = {
    "Batch": "deltabus.bus.consumer",
    "Bus": "deltabus.bus.client",
    "ConfigError": "deltabus.core.errors",
    "Consumer": "deltabus.bus.consumer",
    "DeltabusError": "deltabus.core.errors",
    "Producer": "deltabus.bus.producer",
    "RecordError": "deltabus.bus.producer",
    "StorageError": "deltabus.core.errors",
    "Source": "deltabus.bus.transform",
    "Stream": "deltabus.bus.streams",
    "StreamSettings": "deltabus.bus.streams",
    "Transform": "deltabus.bus.transform",
    "connect": "deltabus.bus.client",
}

if TYPE_CHECKING:
    from deltabus.bus.client import Bus, connect
    from deltabus.bus.consumer import Batch, Consumer
    from deltabus.bus.producer import Producer, RecordError
    from deltabus.bus.streams import Stream, StreamSettings
    from deltabus.bus.transform import Source, Transform
    from deltabus.core.errors import ConfigError, DeltabusError, StorageError


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'deltabus' has no attribute {name!r}")
    return getattr(import_module(home), name)
