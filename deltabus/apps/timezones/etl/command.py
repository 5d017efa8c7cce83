"""The `deltabus etl` command line, for the processes that start the ETL as a child (the
service, the demo, the benchmark and the Dagster assets)."""

from __future__ import annotations

from pathlib import Path

from deltabus.core.intervals import to_ms_arg
from deltabus.core.processes import deltabus_command


def etl_command(
    mode: str = "bounded",
    *,
    commit_interval: float | None = None,
    poll_interval: float | None = None,
    producers: int | None = None,
    until_run: str | None = None,
    threads: int | None = None,
    process: int | None = None,
    processes: int | None = None,
    partitions: int | None = None,
    ready_file: Path | None = None,
    prefix: str | None = None,
    as_json: bool = True,
) -> list[str]:
    """The `deltabus etl` command line; intervals in seconds, None for the ETL's default."""
    args = ["etl", "--mode", mode]
    if commit_interval is not None:
        args += ["--commit-interval-ms", to_ms_arg(commit_interval)]
    if poll_interval is not None:
        args += ["--poll-interval-ms", to_ms_arg(poll_interval)]
    if producers is not None:
        args += ["--producers", str(producers)]
    if until_run is not None:
        args += ["--until-run", until_run]
    if threads is not None:
        args += ["--threads", str(threads)]
    if processes is not None:
        args += ["--process", str(process or 0), "--processes", str(processes)]
    if partitions is not None:
        args += ["--partitions", str(partitions)]
    if ready_file is not None:
        args += ["--ready-file", str(ready_file)]
    return deltabus_command(*args, prefix=prefix, as_json=as_json)
