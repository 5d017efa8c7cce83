"""Where the ETL stands: input positions and sink sequence, read from the unified table.

One reader for the ETL (which resumes from them) and for the service's lag (which the
Dagster sensor reports), so both always agree, also after old log files have expired:
positions are app transactions, which live in the table state and its checkpoints.
Importing this module does not load Pathway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from deltalake import DeltaTable

import deltabus
from deltabus.apps.timezones.contracts import FINISHED_MARK, INPUT_TABLES
from deltabus.delta.lake import Lake
from deltabus.delta.tables import app_transactions, find_commit, meta

log = logging.getLogger(__name__)

ETL_APP_ID = "deltabus-etl"


def position_marker(table: str) -> str:
    """App transaction holding the last input version of `table` in the output: the
    position marker (deltabus.position_marker) of sink `deltabus-etl`."""
    return deltabus.position_marker(ETL_APP_ID, table)


def recorded_positions(
    dt: DeltaTable, tables: Sequence[str] = INPUT_TABLES
) -> tuple[dict[str, int], int]:
    """Input positions (-1: nothing read yet) of `tables` (the inputs of this unified
    table: one partition of each stream) and the next sink sequence number."""
    seq = dt.transaction_version(ETL_APP_ID)
    if seq is None:
        return dict.fromkeys(tables, -1), 0
    positions = {t: dt.transaction_version(position_marker(t)) for t in tables}
    if any(v is None for v in positions.values()):
        # Tables written before positions were app transactions: the commit metadata.
        info = find_commit(dt, lambda c: meta(c, "etl.positions") is not None, limit=1000)
        recorded = meta(info, "etl.positions") if info else {}
        for table, value in positions.items():
            if value is None:
                positions[table] = int(recorded.get(table, -1))
    return {t: int(v) for t, v in positions.items()}, seq + 1


def recorded_finished_runs(dt: DeltaTable) -> dict[str, set[str]]:
    """Producer runs the ETL already saw finish, per input table, from the newest of the
    unified table's last 50 commits that records them (empty when none of them does).

    Input tables written before the `finished` mark carry a run's finish only in commit
    metadata, which log cleanup removes: every unified commit also records the finished
    runs seen so far (maintenance commits and log cleanup can push that record out too).
    """
    info = find_commit(dt, lambda c: meta(c, "etl.finished_runs") is not None, limit=50)
    recorded = meta(info, "etl.finished_runs") if info else {}
    return {table: set(runs) for table, runs in (recorded or {}).items()}


def finished_runs_copied(lake: Lake, unified: str, inputs: Sequence[str]) -> dict[str, set[str]]:
    """Producer runs whose finish mark (FINISHED_MARK) the ETL of `unified` has copied, per
    input table of it (`inputs`: one partition of each stream).

    Read from app transactions only (the producers' marks in the inputs, the ETL's
    positions in `unified`), so log cleanup hides none. A run counts once the ETL's
    position in an input reaches the version that marked it; when that position is behind
    the input's newest version, the input's state at the position must still be readable.
    """
    positions, _ = recorded_positions(lake.open(unified), inputs)
    copied: dict[str, set[str]] = {}
    for table in inputs:
        position = positions.get(table, -1)
        if position < 0 or not lake.exists(table):
            continue
        marks = deltabus.recorded_marks(lake, table, FINISHED_MARK)
        marked = {run for run, value in marks.items() if value}
        # Read after the marks: a mark they hold is at this version or an older one.
        if not marked or position >= lake.latest_version(table):
            copied[table] = marked
            continue
        copied[table] = _marked_at(lake, table, position, marked)
    return copied


def _marked_at(lake: Lake, table: str, version: int, runs: set[str]) -> set[str]:
    """Those of `runs` whose finish mark `table` already held at `version` (none when that
    version's state is no longer readable)."""
    suffix = f":mark:{FINISHED_MARK}"
    known = list(app_transactions(lake, table))
    apps = {run: [app for app in known if app.endswith(f":{run}{suffix}")] for run in runs}
    try:
        dt = lake.open(table, version=version)
    except Exception as exc:  # noqa: BLE001 - expired from the log: no run is proven copied
        log.warning(
            "cannot read %s at version %d (%s): the runs it marked finished since count "
            "once the ETL's position reaches its newest version",
            table,
            version,
            str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
        )
        return set()
    return {run for run in runs if any(dt.transaction_version(app) for app in apps[run])}
