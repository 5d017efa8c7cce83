"""The ETL's output: deltabus' Pathway table sink (deltabus.connectors.pathway) writing
the unified contract, with its positions as `deltabus-etl` app transactions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA
from deltabus.apps.timezones.etl.positions import ETL_APP_ID, recorded_positions
from deltabus.connectors.pathway import Output, Received, TableSink, open_output
from deltabus.delta.lake import Lake


def unified_table(batches: list[Received]) -> pa.Table:
    """Batches of (`timestamp`, `message`, `diff`) rows with their Pathway time and sign
    as one Arrow table in the unified contract: `time` is the batch's, `diff` signed."""
    if not batches:
        return UNIFIED_SCHEMA.empty_table()
    rows = pa.concat_tables([b for b, _, _ in batches])
    heights = [b.num_rows for b, _, _ in batches]
    times = np.repeat(np.array([t for _, t, _ in batches], dtype=np.int64), heights)
    signs = np.repeat(np.array([s for _, _, s in batches], dtype=np.int64), heights)
    diff = rows["diff"].to_numpy() * signs
    return pa.Table.from_arrays(
        [
            rows["timestamp"].cast(pa.float64()),
            rows["message"].cast(pa.string()),
            pa.array(times, pa.int64()),
            pa.array(diff, pa.int64()),
        ],
        schema=UNIFIED_SCHEMA,
    )


class DeltaSinkObserver(TableSink):
    """Commits the unified stream of one partition to `output` (`TableSink`); every
    commit also records the producer runs its inputs saw finish (`finished_runs`), which
    a bounded ETL restarted after their log files expired still needs."""

    def __init__(
        self,
        output: Output,
        commit_interval: float,
        finished_runs: Callable[[], dict[str, list[str]]] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__(
            output,
            commit_interval,
            to_table=unified_table,
            commit_info=(lambda: {"etl.finished_runs": finished_runs()}) if finished_runs else None,
            on_failure=on_failure,
        )


def open_unified(
    lake: Lake, table: str, inputs: list[str], mode: str, *, fence: bool = True
) -> Output:
    """Unified table `table` opened for the ETL sink `deltabus-etl` copying `inputs`,
    claimed for an ETL in `mode` (fencing older ETLs of it) unless `fence` is False."""
    return open_output(
        lake,
        table,
        UNIFIED_SCHEMA,
        app_id=ETL_APP_ID,
        inputs=inputs,
        writer="ETL",
        mode=mode,
        fence=fence,
        positions=lambda snapshot: recorded_positions(snapshot, inputs),
    )
