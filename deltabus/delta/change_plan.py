"""What a commit changed (`plan_changes`), as the protocol defines a version's change
data: its change data files when it has them, else its added and removed files, with the
rows a deletion vector newly hides or shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from deltabus.delta.deletion_vectors import dv_unique_id
from deltabus.delta.table_schema import TableState


@dataclass
class FilePart:
    """Rows of one file that a commit changed, and their sign."""

    # "live": the rows `dv` does not hide; "cdc": change data; "dv": rows in `dv`, not in `minus`
    kind: str
    action: dict[str, Any]
    diff: int = 1
    dv: dict[str, Any] | None = None
    minus: dict[str, Any] | None = None


@dataclass
class ChangePlan:
    parts: list[FilePart] = field(default_factory=list)
    change: bool = False  # the commit deletes or updates rows (not only appends)
    unresolvable: str | None = None  # why its changes cannot be told from the log


def plan_changes(actions: dict[str, list[dict[str, Any]]], state: TableState | None) -> ChangePlan:
    """What a commit changed, as the protocol defines a version's change data.

    1. A commit with `cdc` actions: its change data files, and nothing else.
    2. Otherwise its data-changing `add` files are inserted rows and its data-changing
       `remove` files deleted rows, each as the logical file (rows its deletion vector
       hides are not in it). A file removed and re-added in the same commit with another
       deletion vector (a DELETE or UPDATE with deletion vectors) changed only the rows
       one vector hides and the other does not: those are deleted (newly hidden) or
       inserted again (no longer hidden, e.g. RESTORE).
    Rule 2 gives the rows a commit deleted only when it removes whole files that held
    nothing but deleted rows, which writers guarantee when the table's change data feed
    is on (otherwise they write `cdc` files). Without it, a removed file may have been
    rewritten with copies of its other rows: such a commit is `unresolvable`.
    """
    adds = [a for a in actions.get("add", ()) if a.get("dataChange", True)]
    removes = [r for r in actions.get("remove", ()) if r.get("dataChange", True)]
    cdcs = actions.get("cdc", [])
    plan = ChangePlan(change=bool(removes or cdcs))
    if cdcs:
        plan.parts = [FilePart("cdc", c) for c in cdcs]
        return plan
    added = {unquote(a["path"]): a for a in adds}
    removed = {unquote(r["path"]): r for r in removes}
    for path, add in added.items():
        old = removed.get(path)
        if old is None:
            plan.parts.append(FilePart("live", add, 1, dv=add.get("deletionVector")))
            continue
        new_dv, old_dv = add.get("deletionVector"), old.get("deletionVector")
        if dv_unique_id(new_dv) == dv_unique_id(old_dv):
            continue
        if new_dv:
            plan.parts.append(FilePart("dv", add, -1, dv=new_dv, minus=old_dv))
        if old_dv:
            plan.parts.append(FilePart("dv", add, 1, dv=old_dv, minus=new_dv))
    whole = [r for path, r in removed.items() if path not in added]
    if whole and not (state is not None and state.cdf_enabled):
        plan.unresolvable = (
            f"it removes {len(whole)} data file(s) while the table's change data feed is "
            "off, so the rows it deleted cannot be told from rows it copied into new files"
        )
    for remove in whole:
        plan.parts.append(FilePart("live", remove, -1, dv=remove.get("deletionVector")))
    return plan
