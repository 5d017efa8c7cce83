"""Garbage-collector settings for the long-running streaming processes.

Pathway, Polars and delta-rs bring hundreds of thousands of long-lived Python objects;
with the default thresholds the collector rescans them over and over, and a full
collection in the middle of a commit shows up as a latency spike. Freezing what exists
after start-up and collecting the young generation less often removes that, without
turning collection off.

The frozen objects go back to the collector at exit, so interpreter shutdown frees them
as usual: objects left frozen are never collected, and extension modules built with
nanobind (DuckDB's) then print a page of "leaked instances" warnings as the process ends.
"""

from __future__ import annotations

import atexit
import gc

_unfreeze_at_exit = False


def tune_gc_for_streaming() -> None:
    global _unfreeze_at_exit
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    if not _unfreeze_at_exit:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True
