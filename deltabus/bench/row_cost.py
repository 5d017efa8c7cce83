"""What one message costs inside the ETL's Pathway dataflow, without storage.

Feeds producer-shaped batches (500 rows per Pathway row, as the source sends a Delta
version) through two Python inputs and the ETL's own transform (`unified_expression`),
and reports CPU microseconds per row for three cuts of the dataflow:

- `flatten`: inputs, `concat_reindex`, `flatten`, one column out to `pw.io.null`;
- `transform`: the whole transform (date to epoch ms) out to `pw.io.null`;
- `observer`: the whole transform out to a Python `ConnectorObserver` that keeps the
  columns as the Delta sink does (one Python call per row: Pathway has no batch output).

The ETL process costs about this plus validation and storage; one Pathway worker carries
at most 1e6 / (microseconds per row) rows a second. Run:

    python -m deltabus.bench.row_cost [--batches 2000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import pathway as pw

from deltabus.etl.pipeline import unified_expression
from deltabus.etl.source import BatchSchema

ROWS_PER_BATCH = 500
CUTS = ("flatten", "transform", "observer")


class _Batches(pw.io.python.ConnectorSubject):
    def __init__(self, batches: int, source: str) -> None:
        super().__init__()
        self.batches, self.source = batches, source

    def run(self) -> None:
        rows = [
            ("2026-11-22 22:44:06.123456000 +0100", 0, f"{self.source}-{i:09d}", 1)
            for i in range(ROWS_PER_BATCH)
        ]
        for version in range(self.batches):
            self.next(rows=rows, source=self.source, version=version)


class _Columns(pw.io.python.ConnectorObserver):
    """Keeps what the Delta sink keeps per row."""

    def __init__(self) -> None:
        self.cols: tuple[list, list, list, list] = ([], [], [], [])
        self.rows = 0

    def on_change(self, key: pw.Pointer, row: dict, time: int, is_addition: bool) -> None:
        ts, msg, tm, diff = self.cols
        ts.append(row["timestamp"])
        msg.append(row["message"])
        tm.append(time)
        diff.append(row["diff"])

    def on_time_end(self, time: int) -> None:
        self.rows += len(self.cols[0])
        self.cols = ([], [], [], [])


def measure(cut: str, batches: int) -> dict[str, float]:
    """Run one cut of the dataflow over `batches` batches per input; CPU µs per row."""
    streams = [
        pw.io.python.read(_Batches(batches, s), schema=BatchSchema, autocommit_duration_ms=10)
        for s in ("timezone1", "timezone2")
    ]
    both = pw.Table.concat_reindex(*streams)
    observer = _Columns()
    if cut == "flatten":
        pw.io.null.write(both.flatten(pw.this.rows).select(message=pw.this.rows[2]))
    elif cut == "transform":
        pw.io.null.write(unified_expression(both))
    else:
        pw.io.python.write(unified_expression(both), observer)
    wall, cpu = time.monotonic(), time.process_time()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    rows = 2 * batches * ROWS_PER_BATCH
    out = {"rows": rows, "cpu_us_per_row": cpu / rows * 1e6, "rows_per_s": rows / wall}
    if cut == "observer":
        out["observed"] = observer.rows + len(observer.cols[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000, help="batches per input")
    parser.add_argument("--cut", choices=CUTS, help="measure this cut only (default: each in turn)")
    args = parser.parse_args()
    if args.cut is None:  # each cut in a fresh process: one Pathway run per process
        for cut in CUTS:
            subprocess.run(
                [sys.executable, "-m", "deltabus.bench.row_cost", "--cut", cut]
                + ["--batches", str(args.batches)],
                check=True,
                stderr=subprocess.DEVNULL,
            )
        return
    r = measure(args.cut, args.batches)
    seen = f", {r['observed']:,} seen by the observer" if "observed" in r else ""
    print(
        f"{args.cut:>9}: {r['cpu_us_per_row']:.2f} CPU-µs per row, "
        f"{r['rows_per_s']:,.0f} rows/s ({r['rows']:,} rows{seen})",
        flush=True,
    )


if __name__ == "__main__":
    main()
