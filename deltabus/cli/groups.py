"""`deltabus groups`: list, describe, delete and reset consumer groups."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from deltabus.cli.state import open_bus, print_value
from deltabus.core.errors import ConfigError

groups_app = typer.Typer(help="Inspect consumer groups.", no_args_is_help=True)


@groups_app.command("list")
def groups_list() -> None:
    """The consumer groups with members or positions in the lake."""
    for name in open_bus().groups():
        print(name)


@groups_app.command("delete")
def groups_delete(group: Annotated[str, typer.Argument(help="Consumer group name.")]) -> None:
    """Delete a consumer group's positions and leases; refused while it has live
    members."""
    print_value({"deleted": group, "objects": open_bus().delete_group(group)})


@groups_app.command("reset-offsets")
def groups_reset_offsets(
    group: Annotated[str, typer.Argument(help="Consumer group name.")],
    stream: Annotated[
        list[str] | None, typer.Option(help="Only these streams (default: every stream).")
    ] = None,
    to_earliest: Annotated[
        bool,
        typer.Option("--to-earliest", help="From the oldest version each table's retention keeps."),
    ] = False,
    to_latest: Annotated[
        bool, typer.Option("--to-latest", help="Only what lands from now on.")
    ] = False,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            help="From the first version committed at or after this ISO-8601 instant "
            "with a zone, e.g. 2026-11-28T06:00:00Z."
        ),
    ] = None,
    to_version: Annotated[
        int | None, typer.Option(help="From this version of each partition table.", min=0)
    ] = None,
    partition: Annotated[
        int | None, typer.Option(help="Only this partition of each stream.", min=0)
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the new positions; write nothing.")
    ] = False,
) -> None:
    """Set a group's positions, as kafka-consumer-groups --reset-offsets does; refused
    while the group has live members. Prints each partition's position before and after."""

    chosen = [
        (flag, value)
        for flag, value in (
            ("earliest", to_earliest or None),
            ("latest", to_latest or None),
            ("datetime", to_datetime),
            ("version", to_version),
        )
        if value is not None
    ]
    if len(chosen) != 1:
        raise ConfigError(
            "give exactly one of --to-earliest, --to-latest, --to-datetime, --to-version"
        )
    to, value = chosen[0]
    if to == "datetime":
        try:
            value = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"--to-datetime {to_datetime!r} is not an ISO-8601 instant",
                "e.g. 2026-11-28T06:00:00Z",
            ) from None
    bus = open_bus()
    names = stream if stream else bus.streams()
    resets = bus.reset_offsets(
        group,
        names,
        to,
        value,
        partition=partition,
        dry_run=dry_run,  # type: ignore[arg-type]
    )
    print_value(
        {
            "group": group,
            "dry_run": dry_run,
            "partitions": {r.table: {"before": r.before, "after": r.after} for r in resets},
        }
    )


@groups_app.command("describe")
def groups_describe(
    group: Annotated[str, typer.Argument(help="Consumer group name.")],
    stream: Annotated[
        list[str] | None, typer.Option(help="Only these streams (default: every stream).")
    ] = None,
) -> None:
    """A group's live members, and per partition its holder, position and lag (versions
    and records landed that the group has not committed)."""
    print_value(open_bus().describe_group(group, stream))


# -- produce and consume -------------------------------------------------------------------
