"""The soak's maintenance process hands freed memory back between passes."""

from __future__ import annotations

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc

from deltabus_bench.delta.maintenance_loop import release_memory

MB = 1 << 20


def test_release_memory_returns_a_freed_arrow_buffer_to_the_system() -> None:
    process = psutil.Process()
    doubled = pc.multiply(pa.array(np.arange(25_000_000)), 2)  # 200 MB from Arrow's pool
    del doubled
    held = process.memory_info().rss
    release_memory()
    assert process.memory_info().rss < held - 100 * MB
