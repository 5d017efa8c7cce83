"""The ETL's output: deltabus' Pathway table sink (deltabus.connectors.pathway) writing
the unified contract, with its positions as `deltabus-etl` app transactions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from deltabus.apps.timezones.contracts import UNIFIED_SCHEMA
from deltabus.apps.timezones.etl.positions import ETL_APP_ID
from deltabus.bus.fence import Lease
from deltabus.connectors.pathway.sink import Received, TableSink
from deltabus.delta.append import TableAppender
from deltabus.delta.checkpoints import BackgroundCheckpointer


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
    """Commits the unified stream of one partition (`TableSink`); every commit also
    records the producer runs its inputs saw finish (`finished_runs`), which a bounded ETL
    restarted after their log files expired still needs."""

    def __init__(
        self,
        appender: TableAppender,
        positions: dict[str, int],
        commit_interval: float,
        next_seq: int,
        checkpointer: BackgroundCheckpointer | None = None,
        finished_runs: Callable[[], dict[str, list[str]]] | None = None,
        lease: Lease | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__(
            appender,
            positions,
            commit_interval,
            next_seq,
            app_id=ETL_APP_ID,
            to_table=unified_table,
            checkpointer=checkpointer,
            commit_info=(lambda: {"etl.finished_runs": finished_runs()}) if finished_runs else None,
            lease=lease,
            on_failure=on_failure,
        )
