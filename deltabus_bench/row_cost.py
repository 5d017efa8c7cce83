"""What one message costs inside the ETL's Pathway dataflow, without storage.

Feeds producer-shaped batches (`--rows` rows per Pathway row, as the source sends one
Delta version: 500 at 10k msg/s and 100 ms commits, 125,000 at 250k msg/s and 1000 ms)
through two Python inputs and the ETL's own transform (`unified_expression`), and
reports CPU microseconds per message for three cuts of the dataflow:

- `engine`: inputs and `concat_reindex` out to `pw.io.null` (Pathway's cost per batch);
- `transform`: the whole transform (date to epoch ms) out to `pw.io.null`;
- `observer`: the whole transform out to a Python `ConnectorObserver` that builds the
  unified Arrow table as the Delta sink does before a commit.

The ETL process costs about this plus validation and storage; one Pathway worker carries
at most 1e6 / (microseconds per message) messages a second. Run:

    python -m deltabus_bench.row_cost [--batches 2000] [--rows 500]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import pathway as pw
import polars as pl
import pyarrow as pa

from deltabus.apps.timezones.etl.pipeline import unified_expression
from deltabus.apps.timezones.etl.sink import unified_table
from deltabus.apps.timezones.etl.source import ARROW_COMPAT, BatchSchema

CUTS = ("engine", "transform", "observer")


def _dates(rows: int) -> list[str]:
    """Distinct canonical dates, one per message, as the producer's would be."""
    return [
        f"2026-11-22 {h:02d}:{m:02d}:{sec:02d}.{i % 1_000_000:06d}000 +010000"
        for i in range(rows)
        for h, m, sec in [((i // 3600) % 24, (i // 60) % 60, i % 60)]
    ]


class _Batches(pw.io.python.ConnectorSubject):
    def __init__(self, batches: int, rows: int, source: str) -> None:
        super().__init__()
        self.batches, self.rows, self.source = batches, rows, source

    def run(self) -> None:
        rows = pl.DataFrame(
            {
                "date": _dates(self.rows),
                "message": [f"{self.source}-{i:09d}" for i in range(self.rows)],
                "diff": [1] * self.rows,
            }
        )
        table = rows.to_arrow(compat_level=ARROW_COMPAT)
        for version in range(self.batches):
            self.next(rows=pw.wrap_py_object(table), source=self.source, version=version)


class _Tables(pw.io.python.ConnectorObserver):
    """Builds what the Delta sink builds per Pathway time."""

    def __init__(self) -> None:
        self.batches: list[tuple[pa.Table, int, int]] = []
        self.rows = 0

    def on_change(self, key: pw.Pointer, row: dict, time: int, is_addition: bool) -> None:
        self.batches.append((row["rows"].value, time, 1 if is_addition else -1))

    def on_time_end(self, time: int) -> None:
        self.rows += unified_table(self.batches).num_rows
        self.batches = []


def measure(cut: str, batches: int, rows_per_batch: int) -> dict[str, float]:
    """Run one cut of the dataflow over `batches` batches per input; CPU µs per message."""
    streams = [
        pw.io.python.read(
            _Batches(batches, rows_per_batch, s), schema=BatchSchema, autocommit_duration_ms=10
        )
        for s in ("timezone1", "timezone2")
    ]
    both = pw.Table.concat_reindex(*streams)
    observer = _Tables()
    if cut == "engine":
        pw.io.null.write(both.select(version=pw.this.version))
    elif cut == "transform":
        pw.io.null.write(unified_expression(both))
    else:
        pw.io.python.write(unified_expression(both), observer)
    wall, cpu = time.monotonic(), time.process_time()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    rows = 2 * batches * rows_per_batch
    out = {"rows": rows, "cpu_us_per_row": cpu / rows * 1e6, "rows_per_s": rows / wall}
    if cut == "observer":
        out["observed"] = observer.rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000, help="batches per input")
    parser.add_argument("--rows", type=int, default=500, help="messages per batch")
    parser.add_argument("--cut", choices=CUTS, help="measure this cut only (default: each in turn)")
    args = parser.parse_args()
    if args.cut is None:  # each cut in a fresh process: one Pathway run per process
        for cut in CUTS:
            subprocess.run(
                [sys.executable, "-m", "deltabus_bench.row_cost", "--cut", cut]
                + ["--batches", str(args.batches), "--rows", str(args.rows)],
                check=True,
                stderr=subprocess.DEVNULL,
            )
        return
    r = measure(args.cut, args.batches, args.rows)
    seen = f", {r['observed']:,} seen by the observer" if "observed" in r else ""
    print(
        f"{args.cut:>9}: {r['cpu_us_per_row']:.2f} CPU-µs per message, "
        f"{r['rows_per_s']:,.0f} messages/s ({r['rows']:,} messages{seen})",
        flush=True,
    )


if __name__ == "__main__":
    main()
