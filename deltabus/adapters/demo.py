"""The whole flow once, without Dagster: the ETL in its own process, the producer, CSV."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from deltabus.apps.timezones.contracts import UNIFIED_TABLE
from deltabus.apps.timezones.duck import lake_connection
from deltabus.apps.timezones.etl.command import etl_command
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.apps.timezones.results import export_results
from deltabus.core.errors import DeltabusError
from deltabus.core.processes import ChildProcess, child_env
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)


def run_demo(lake: Lake, *, rate: float, duration: float, out: Path) -> dict:
    prefix = f"{lake.settings.prefix}/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    run_lake = Lake(lake.settings.with_prefix(prefix))
    started = time.monotonic()
    log.info(
        "demo on %s: ETL first, then %g s of producing at %g msg/s", run_lake.root, duration, rate
    )
    work = Path(tempfile.mkdtemp(prefix="deltabus-demo-"))
    ready = work / "etl-ready"
    etl = ChildProcess(
        "etl",
        etl_command("bounded", ready_file=ready, prefix=prefix),
        child_env(lake.settings),
        work,
    ).start()
    try:
        etl.wait_file(ready, timeout=120)
        report = TimezoneProducer(run_lake, ProducerConfig(rate=rate, duration=duration)).run(
            on_progress=lambda p: log.info("produced %d/%d", p["messages"], p["total"])
        )
        etl.wait(timeout=max(120, duration * 5))
    finally:
        etl.stop(timeout=10)
    if etl.returncode != 0:
        raise DeltabusError(
            f"the ETL process failed with status {etl.returncode}",
            f"see its log, {etl.stderr_path}:\n{etl.stderr_tail()}",
        )
    rows = export_results(run_lake, out)
    con = lake_connection(run_lake, (UNIFIED_TABLE,))
    p50, p99 = con.execute(
        f"SELECT quantile_cont(time - timestamp, 0.5), quantile_cont(time - timestamp, 0.99) "
        f"FROM {UNIFIED_TABLE} WHERE diff > 0"
    ).fetchone()  # type: ignore[misc]
    return {
        "lake": run_lake.root,
        "messages produced": report.messages,
        "achieved rate (msg/s)": report.achieved_rate,
        "unified rows": rows,
        "ETL processing latency p50/p99 (ms)": f"{p50:.0f} / {p99:.0f}",
        "results CSV": str(out),
        "elapsed (s)": round(time.monotonic() - started, 1),
        "etl": etl.stdout_json(),
    }
