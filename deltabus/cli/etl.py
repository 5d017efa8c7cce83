"""`deltabus etl` (the time-zone ETL) and `deltabus link` (a Pathway link program), each
run alone or as replicas sharing partitions by leases."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from deltabus.cli.common import PartitionsOption
from deltabus.cli.root import app
from deltabus.cli.state import emit, lake
from deltabus.core import metrics
from deltabus.core.errors import ConfigError
from deltabus.core.extras import needs_extra
from deltabus.core.intervals import DEFAULT_COMMIT_INTERVAL_MS, DEFAULT_POLL_INTERVAL_MS, from_ms


class EtlMode(StrEnum):
    bounded = "bounded"
    continuous = "continuous"


class CorruptFileAction(StrEnum):
    stop = "stop"
    skip = "skip"


class LeaseChildren(StrEnum):
    per_partition = "per-partition"
    per_set = "per-set"
    per_batch = "per-batch"


@app.command()
@needs_extra("pathway", "deltabus etl")
def etl(
    mode: Annotated[
        EtlMode,
        typer.Option(
            help="bounded: stop when the inputs are finished; continuous: run until stopped."
        ),
    ] = EtlMode.bounded,
    commit_interval_ms: Annotated[
        float, typer.Option(help="Commit the unified table this often (1 .. 60000 ms).")
    ] = DEFAULT_COMMIT_INTERVAL_MS,
    poll_interval_ms: Annotated[
        float, typer.Option(help="Poll the inputs for new versions this often (1 .. 60000 ms).")
    ] = DEFAULT_POLL_INTERVAL_MS,
    producers: Annotated[
        int, typer.Option(help="Bounded mode: finished producer runs to wait for per table.")
    ] = 1,
    until_run: Annotated[
        list[str] | None,
        typer.Option(
            help="Bounded mode: stop once this producer run (repeatable) has finished in both "
            "inputs, whatever runs the tables finished before; replaces --producers.",
        ),
    ] = None,
    ready_file: Annotated[
        Path | None, typer.Option(help="Create this file once the dataflow is running.")
    ] = None,
    threads: Annotated[int, typer.Option(help="Pathway worker threads.")] = 1,
    process: Annotated[
        int,
        typer.Option(
            help="This ETL's index among --processes: it owns partitions i with "
            "i mod processes == process (like a consumer group member).",
        ),
    ] = 0,
    processes: Annotated[
        int, typer.Option(help="ETL processes sharing the partitions (1..P).")
    ] = 1,
    partitions: PartitionsOption = None,
    lease: Annotated[
        bool,
        typer.Option(
            "--lease",
            help="Continuous mode: share the partitions with the lake's other --lease ETLs "
            "by leases in the lake (consumer group etl.timezone_unified), with no "
            "--process/--processes: take free partitions, hand some over when a replica "
            "joins, take a dead one's within the lease time. Runs the ETL of the "
            "partitions it holds as child processes, each its own single-machine Pathway "
            "program. SIGTERM leaves the group at once.",
        ),
    ] = False,
    lease_ttl_s: Annotated[
        float,
        typer.Option(
            help="With --lease: the lease time. A replica not heard from for this long "
            "loses its partitions to the others (1 .. 600 s).",
        ),
    ] = 10.0,
    lease_children: Annotated[
        LeaseChildren,
        typer.Option(
            help="With --lease: one ETL child per batch of partitions taken together (a "
            "child that must give one up restarts with the rest), one per partition, or one "
            "for the whole held set (restarted whenever the set changes).",
        ),
    ] = LeaseChildren.per_batch,
    lease_spare: Annotated[
        bool,
        typer.Option(
            help="With --lease: keep a spare ETL child waiting with Pathway loaded, so a "
            "partition taken over starts processing without Pathway's start-up time.",
        ),
    ] = True,
    partition_list: Annotated[
        str | None,
        typer.Option(
            help="Run exactly these partitions (comma-separated indices, e.g. 0,2) instead "
            "of --process/--processes; '-': read them as one line from stdin once Pathway "
            "is loaded (a --lease ETL's spare child).",
        ),
    ] = None,
    parent_pid: Annotated[int | None, typer.Option(hidden=True)] = None,
    on_corrupt_file: Annotated[
        CorruptFileAction | None,
        typer.Option(
            help="An input data file that cannot be read as Parquet (corrupt, truncated): "
            "stop (exit 2 naming the table, version and file; nothing of that version is "
            "written, positions stay) or skip it (logged, counted as skipped_files in the "
            "report; its rows never reach timezone_unified). Default: "
            "DELTABUS_ON_CORRUPT_FILE, else stop.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the Pathway ETL: tail both inputs, parse dates, write timezone_unified."""
    from deltabus.apps.timezones.etl.config import EtlConfig
    from deltabus.core.pipes import report_to_dagster

    only = None
    if lease or partition_list is not None:
        from deltabus.adapters.etl_lease import SPARE, follow_parent, parse_partition_list

        given = "--lease" if lease else "--partition-list"
        if process != 0 or processes != 1:
            raise ConfigError(
                f"{given} and --process/--processes both say which partitions to run",
                f"give one of them: {given}, or --process and --processes",
            )
        if lease and mode is not EtlMode.continuous:
            raise ConfigError(
                "--lease runs until stopped: it needs --mode continuous",
                "add --mode continuous, or run a bounded ETL without --lease",
            )
        if lease and partition_list is not None:
            raise ConfigError("--lease decides the partitions itself", "leave out --partition-list")
        if partition_list is not None and partition_list != SPARE:
            only = parse_partition_list(partition_list)
        if parent_pid is not None:
            follow_parent(parent_pid)
    config = EtlConfig(
        bounded=mode is EtlMode.bounded,
        commit_interval=from_ms(commit_interval_ms),
        poll_interval=from_ms(poll_interval_ms, "poll interval"),
        expected_producers=producers,
        until_runs=frozenset(until_run or ()),
        threads=threads,
        process=process,
        processes=processes,
        partitions=partitions,
        only=only,
        on_corrupt_file=on_corrupt_file.value if on_corrupt_file else None,
    )
    if lease:
        from deltabus.adapters.etl_lease import LeaseConfig, lease_etl

        lease_config = LeaseConfig(lease_ttl_s, lease_children.value, lease_spare)
        child_args = [
            *("--commit-interval-ms", str(commit_interval_ms)),
            *("--poll-interval-ms", str(poll_interval_ms), "--threads", str(threads)),
            *(["--on-corrupt-file", on_corrupt_file.value] if on_corrupt_file else []),
        ]
        emit(
            "ETL lease report",
            lease_etl(lake(write=True), config, child_args, lease_config, ready_file),
        )
        return
    from deltabus.apps.timezones.etl.pipeline import run_etl

    lk = lake(write=True)
    if partition_list == "-":  # a spare: Pathway is loaded now, the partitions come next
        from dataclasses import replace

        from deltabus.adapters.etl_lease import await_partitions

        given = await_partitions(ready_file)
        if given is None:
            return  # dismissed before it had partitions
        config = replace(config, only=given)
    report = run_etl(lk, config, ready_file=ready_file)
    emit("ETL report", report.as_dict())
    report_to_dagster(
        {
            "rows": report.rows,
            "rejected_rows": report.rejected,
            "delta_version": report.unified_version,
            "commits": report.commits,
            "elapsed_s": report.elapsed_s,
            "throughput_rows_s": report.throughput_rows_s,
        },
        asset_key="timezone_unified",
    )


@app.command("link", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def link(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The link's name, as its program names its Link.")],
    target: Annotated[
        str, typer.Option(help="The declared stream the link writes: its partitions are shared.")
    ],
    lease_ttl_s: Annotated[
        float,
        typer.Option(
            help="The lease time. A replica not heard from for this long loses its "
            "partitions to the others (1 .. 600 s).",
        ),
    ] = 10.0,
    ready_file: Annotated[
        Path | None, typer.Option(help="Create this file once the replica has joined its group.")
    ] = None,
) -> None:
    """Run a Pathway link program (the command after --) as one of several replicas that
    share the link's partitions by leases in the lake (group link.NAME).

    The program runs as a child for the partitions held (`Link` reads them from
    DELTABUS_LINK and DELTABUS_LINK_PARTITIONS) and restarts when they change. Example:
    deltabus link eur --target orders_eur -- python eur.py
    """
    from deltabus.adapters.link_lease import lease_link

    metrics.set_component("link-lease")
    command = [a for a in ctx.args if a != "--"] if ctx.args[:1] == ["--"] else list(ctx.args)
    emit(
        "link lease report",
        lease_link(lake(write=True), name, target, command, lease_ttl_s, ready_file),
    )
