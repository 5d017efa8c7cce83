"""The whole flow once, without Dagster: the ETL in its own process, the producer, CSV."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deltabus.duck import lake_connection
from deltabus.errors import DeltabusError
from deltabus.lake import UNIFIED_TABLE, Lake
from deltabus.producer import Producer, ProducerConfig
from deltabus.results import export_results

log = logging.getLogger(__name__)


def etl_command(prefix: str, *args: str) -> list[str]:
    """The command line that runs the ETL as its own process on the lake `prefix`."""
    return [sys.executable, "-m", "deltabus", "--json", "--prefix", prefix, "etl", *args]


def wait_ready(process: subprocess.Popen, ready: Path, timeout: float = 120) -> None:
    """Wait until the ETL process has its dataflow running (Pathway takes seconds to load)."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None:
            raise DeltabusError(f"the ETL process exited early with status {process.returncode}")
        if time.monotonic() > deadline:
            raise DeltabusError(f"the ETL process was not ready after {timeout:.0f}s")
        time.sleep(0.05)


def run_demo(lake: Lake, *, rate: float, duration: float, out: Path) -> dict:
    prefix = f"{lake.settings.prefix}/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    run_lake = Lake(lake.settings.with_prefix(prefix))
    started = time.monotonic()
    log.info(
        "demo on %s: ETL first, then %g s of producing at %g msg/s", run_lake.root, duration, rate
    )
    ready = Path(tempfile.mkdtemp()) / "etl-ready"
    etl = subprocess.Popen(
        etl_command(prefix, "--mode", "bounded", "--ready-file", str(ready)),
        stdout=subprocess.PIPE,
    )
    try:
        wait_ready(etl, ready)
        report = Producer(run_lake, ProducerConfig(rate=rate, duration=duration)).run(
            on_progress=lambda p: log.info("produced %d/%d", p["messages"], p["total"])
        )
        stdout, _ = etl.communicate(timeout=max(120, duration * 5))
    finally:
        if etl.poll() is None:
            etl.kill()
    if etl.returncode != 0:
        raise DeltabusError(
            f"the ETL process failed with status {etl.returncode}", "see its log above"
        )
    rows = export_results(run_lake, out)
    con = lake_connection(run_lake, (UNIFIED_TABLE,))
    p50, p99 = con.execute(
        f"SELECT quantile_cont(time - timestamp, 0.5), quantile_cont(time - timestamp, 0.99) "
        f"FROM {UNIFIED_TABLE}"
    ).fetchone()  # type: ignore[misc]
    return {
        "lake": run_lake.root,
        "messages produced": report.messages,
        "achieved rate (msg/s)": report.achieved_rate,
        "unified rows": rows,
        "ETL processing latency p50/p99 (ms)": f"{p50:.0f} / {p99:.0f}",
        "results CSV": str(out),
        "elapsed (s)": round(time.monotonic() - started, 1),
        "etl": stdout.decode().strip(),
    }
