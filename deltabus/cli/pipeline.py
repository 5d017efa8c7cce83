"""`deltabus results` and `deltabus demo`: the time-zone pipeline end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deltabus.cli.common import check_output
from deltabus.cli.root import app
from deltabus.cli.state import emit, lake
from deltabus.core.extras import needs_extra


@app.command()
@needs_extra("pathway", "deltabus results")
def results(
    out: Annotated[Path, typer.Option(help="CSV file to write.")] = Path("results.csv"),
    net: Annotated[
        bool,
        typer.Option(
            help="Only the current content (retracted rows left out) instead of the changelog."
        ),
    ] = False,
) -> None:
    """Export timezone_unified as CSV (timestamp,message,time,diff), ordered by time.

    By default the changelog: a row with diff -1 retracts an earlier row (an input deleted
    or updated it). With --net, the net content only.
    """
    from deltabus.apps.timezones.results import export_results

    check_output(out)
    rows = export_results(lake(), out, net=net)
    print(f"wrote {rows} rows to {out}")


@app.command()
@needs_extra("pathway", "deltabus demo")
def demo(
    rate: Annotated[float, typer.Option(help="Messages per second.")] = 10_000,
    duration: Annotated[float, typer.Option(help="Seconds to produce for.")] = 10,
    out: Annotated[Path, typer.Option(help="CSV file for the results.")] = Path("results.csv"),
) -> None:
    """Run the whole flow once, without Dagster: ETL process + producer + CSV export."""
    from deltabus.adapters.demo import run_demo

    emit("demo summary", run_demo(lake(write=True), rate=rate, duration=duration, out=out))
