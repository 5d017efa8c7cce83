"""Small JSON records kept as a numbered log of objects, each claimed with a conditional
create, so that a change is a race one writer wins on any store deltabus supports.

`<prefix>/<seq, 12 digits>.json` holds revision `seq`; the current record is the highest.
A writer that read revision k writes k + 1 with If-None-Match: when two writers race,
one create succeeds and the other learns it lost (`claim` returns False). This is how
the Delta log claims versions, and it needs no If-Match, which a local directory lacks
(docs/adr/0037-streams-and-groups.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, PreconditionError

from deltabus.core.retry import retry_storage

DIGITS = 12


@dataclass(frozen=True)
class Revision:
    """One revision of a record: its number and its JSON body."""

    seq: int
    body: dict[str, Any]


def key(prefix: str, seq: int) -> str:
    return f"{prefix}/{seq:0{DIGITS}d}.json"


def _seq_of(path: str) -> int | None:
    name = path.rsplit("/", 1)[-1]
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "json" and len(stem) == DIGITS and stem.isdigit() else None


def revisions(store: Any, prefix: str) -> list[int]:
    """The revision numbers under `prefix`, oldest first (one LIST)."""

    def listed() -> list[int]:
        found: list[int] = []
        for chunk in obstore.list(store, prefix=f"{prefix}/"):
            for meta in chunk:
                seq = _seq_of(str(meta["path"]))
                if seq is not None:
                    found.append(seq)
        return sorted(found)

    return retry_storage(listed, what=f"list {prefix}")


def read(store: Any, prefix: str, seq: int) -> Revision | None:
    """Revision `seq`, or None when it does not exist (pruned, or not written yet)."""

    def get() -> bytes | None:
        try:
            return bytes(obstore.get(store, key(prefix, seq)).bytes())
        except FileNotFoundError:
            return None

    raw = retry_storage(get, what=f"read {key(prefix, seq)}")
    return None if raw is None else Revision(seq, json.loads(raw))


def latest(store: Any, prefix: str) -> Revision | None:
    """The current revision (the highest number), or None when there is none.

    A revision pruned between the LIST and the GET is followed by a newer one, so the
    LIST is repeated."""
    for _ in range(5):
        seqs = revisions(store, prefix)
        if not seqs:
            return None
        found = read(store, prefix, seqs[-1])
        if found is not None:
            return newest_from(store, prefix, found)
    raise RuntimeError(f"{prefix}: revisions vanish faster than they can be read")


def newest_from(store: Any, prefix: str, known: Revision) -> Revision:
    """The newest revision at or after `known`, found by GETs of the next numbers."""
    current = known
    while (following := read(store, prefix, current.seq + 1)) is not None:
        current = following
    return current


def claim(store: Any, prefix: str, seq: int, body: dict[str, Any]) -> bool:
    """Write revision `seq` unless it exists; False when another writer has it."""
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    def put() -> bool:
        try:
            obstore.put(store, key(prefix, seq), data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    # A retried create whose first attempt landed finds its own body there.
    def attempt() -> bool:
        if put():
            return True
        mine = read(store, prefix, seq)
        return mine is not None and mine.body == body

    return retry_storage(attempt, what=f"write {key(prefix, seq)}")


def prune(store: Any, prefix: str, below: int) -> None:
    """Delete the revisions numbered below `below` (a best effort: a failure waits for
    the next prune)."""
    for seq in revisions(store, prefix):
        if seq >= below:
            break
        try:
            obstore.delete(store, key(prefix, seq))
        except Exception:  # noqa: BLE001 - an old revision left behind harms no reader
            return
