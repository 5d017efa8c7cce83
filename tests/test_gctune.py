"""The streaming processes' collector settings end cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_frozen_objects_are_freed_at_exit_without_leak_warnings() -> None:
    """A process that froze the collector (producer, ETL, bench consumer) and has DuckDB
    loaded exits without nanobind's "leaked instances" page: the frozen objects are
    handed back to the collector before shutdown."""
    code = (
        "import gc, duckdb\n"
        "from deltabus.core.gctune import tune_gc_for_streaming\n"
        "duckdb.connect().execute('SELECT 1::BIGINT').fetchall()\n"
        "tune_gc_for_streaming()\n"
        "tune_gc_for_streaming()\n"
        "assert gc.get_freeze_count() > 0\n"
        "assert gc.get_threshold()[0] == 50_000\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr[:2000]
