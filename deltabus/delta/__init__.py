"""Delta Lake on an object store: the protocol, the lake, appends, checkpoints, maintenance."""
