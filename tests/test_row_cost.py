"""`python -m deltabus_bench.row_cost`: the ETL's Pathway dataflow, per row."""

from __future__ import annotations

import re
import subprocess
import sys


def test_row_cost_runs_every_cut_and_the_observer_sees_every_row() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "deltabus_bench.row_cost", "--batches", "4"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    cuts = dict(re.findall(r"^\s*(\w+): ([0-9.]+) CPU-µs per message", out, re.MULTILINE))
    assert set(cuts) == {"engine", "transform", "observer"}, out
    assert all(float(v) > 0 for v in cuts.values()), out
    # 4 batches of 500 rows on each of the two inputs, all through the transform.
    assert "(4,000 messages, 4,000 seen by the observer)" in out, out
