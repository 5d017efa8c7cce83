"""Consumer groups: partitions shared among a group's members by leases in the lake.

Under `_deltabus/groups/<group>/`:

- `members/<member>.json`: a member's heartbeat, rewritten every `ttl / 3` seconds. A
  member whose heartbeat is older than `ttl` (by the store's clock) is gone.
- `partitions/<table>/`: a record log (deltabus.bus.record_log) per partition table:
  `{"member", "position", "expires_ms"}`, the holder (None: free), the next version
  the group reads, and when the holder's lease ends unless renewed.

Every live member computes the same assignment (the group's partitions in order, dealt to
the live members in order) and takes the partitions dealt to it when they are free or
their lease has ended; it releases those dealt to another. A holder renews its lease,
and commits a position, by writing the partition's next revision: if another member
wrote that revision first, the lease was lost and the holder stops reading the
partition. A member that dies loses its partitions within `ttl` plus one heartbeat, and
the taker resumes after its last committed position. Clocks: heartbeat ages and
lease ends are read by the store's clock (each member's clock plus the offset its own
heartbeat's Last-Modified shows), so members whose clocks disagree by more than `ttl`
still agree; the offset is as precise as the store's Last-Modified (a second on S3).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import obstore

from deltabus.bus import record_log
from deltabus.core import metrics
from deltabus.core.errors import ConfigError
from deltabus.core.retry import retry_storage
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

GROUPS_PREFIX = "_deltabus/groups"
DEFAULT_TTL_S = 10.0
GROUP_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")


def check_group(name: str) -> str:
    if not name or len(name) > 100 or not set(name) <= GROUP_CHARS:
        raise ConfigError(
            f"group {name!r} is not a usable group name",
            "use 1-100 lower-case letters, digits, '_', '-' and '.'",
        )
    return name


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Lease:
    """A partition as its log says: holder, next version to read, lease end."""

    table: str
    seq: int
    member: str | None
    position: int
    expires_ms: int

    def body(self) -> dict[str, Any]:
        return {"member": self.member, "position": self.position, "expires_ms": self.expires_ms}

    def free(self, at_ms: int) -> bool:
        return self.member is None or self.expires_ms <= at_ms


class Group:
    """One member's view of a group: its heartbeat, and the leases it reads and writes."""

    def __init__(
        self, lake: Lake, group: str, ttl_s: float = DEFAULT_TTL_S, member: str | None = None
    ) -> None:
        self.lake = lake
        self.store = lake.object_store
        self.name = check_group(group)
        self.ttl_ms = int(ttl_s * 1000)
        self.member = member or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.prefix = f"{GROUPS_PREFIX}/{self.name}"
        # The store's clock: every time a member compares (heartbeat ages, lease ends) is
        # local time plus the offset its own heartbeat's Last-Modified showed, so members
        # whose clocks disagree still agree on who is live.
        self.clock: Callable[[], float] = time.time
        self._offset_ms = 0.0
        self._put_at_ms: float | None = None

    # -- members ----------------------------------------------------------------------------

    def _member_key(self, member: str) -> str:
        return f"{self.prefix}/members/{member}.json"

    def heartbeat(self) -> None:
        """Say this member is alive (one PUT)."""
        body = f'{{"member":"{self.member}","at_ms":{now_ms()}}}'.encode()
        sent = self.clock() * 1000
        retry_storage(
            lambda: obstore.put(self.store, self._member_key(self.member), body),
            what=f"heartbeat of group {self.name}",
        )
        self._put_at_ms = (sent + self.clock() * 1000) / 2

    def now_ms(self) -> int:
        """Now by the store's clock, as this member last measured it (`live_members`)."""
        return int(self.clock() * 1000 + self._offset_ms)

    def leave(self) -> None:
        """Remove this member's heartbeat, so the others rebalance at once."""
        try:
            obstore.delete(self.store, self._member_key(self.member))
        except Exception:  # noqa: BLE001 - an old heartbeat ages out by itself
            pass

    def live_members(self) -> list[str]:
        """Members whose heartbeat is younger than the lease time, by the store's clock
        (one LIST), sorted. This member's own heartbeat in the listing sets the offset
        from its clock to the store's (`now_ms`)."""

        def listed() -> dict[str, float]:
            return {
                str(meta["path"]).rsplit("/", 1)[-1].removesuffix(".json"): meta[
                    "last_modified"
                ].timestamp()
                * 1000
                for chunk in obstore.list(self.store, prefix=f"{self.prefix}/members/")
                for meta in chunk
            }

        beats = retry_storage(listed, what=f"list the members of group {self.name}")
        own = beats.get(self.member)
        if own is not None and self._put_at_ms is not None:
            self._offset_ms = own - self._put_at_ms
        horizon = self.now_ms() - self.ttl_ms
        return sorted(name for name, at in beats.items() if at > horizon)

    # -- assignment -------------------------------------------------------------------------

    def assigned(self, partitions: list[str], live: list[str]) -> list[str]:
        """The partitions dealt to this member by the group's current assignment.

        The assignment is a record of the group (`assignment/`): the live members it was
        made for and who gets what. When the live members differ from the record's, the
        first live member (by name, the group's leader) records a new one with
        `sticky_assignment` from the old, so a join or a leave moves only the partitions
        that must move; the others go on with the recorded one until it does. One LIST
        and one GET; a PUT when the leader deals anew.
        """
        live = sorted(live)
        prefix = f"{self.prefix}/assignment"
        current = record_log.latest(self.store, prefix)
        body = current.body if current is not None else {"members": [], "assignment": {}}
        if body["members"] != live and live and live[0] == self.member:
            dealt = sticky_assignment(partitions, live, body["assignment"])
            seq = 0 if current is None else current.seq + 1
            record = {"members": live, "assignment": dealt}
            if record_log.claim(self.store, prefix, seq, record):
                body = record
                moved = sum(
                    1
                    for m, ps in dealt.items()
                    for p in ps
                    if p not in (current.body["assignment"].get(m, []) if current else [])
                )
                log.info(
                    "group %s: %s dealt %d partition(s) to %d member(s), %d moved",
                    self.name,
                    self.member,
                    len(partitions),
                    len(live),
                    moved,
                )
                if seq >= 2 and seq % 16 == 0:
                    record_log.prune(self.store, prefix, seq - 1)
        if self.member not in body["members"]:
            return []
        wanted = set(partitions)
        return [p for p in body["assignment"].get(self.member, []) if p in wanted]

    # -- leases -----------------------------------------------------------------------------

    def _log(self, table: str) -> str:
        return f"{self.prefix}/partitions/{table}"

    def lease(self, table: str) -> Lease | None:
        """The partition's current revision (None: the group never read it)."""
        found = record_log.latest(self.store, self._log(table))
        if found is None:
            return None
        return self._lease(table, found)

    @staticmethod
    def _lease(table: str, found: record_log.Revision) -> Lease:
        body = found.body
        return Lease(
            table, found.seq, body.get("member"), int(body["position"]), int(body["expires_ms"])
        )

    def write(
        self, current: Lease | None, table: str, member: str | None, position: int
    ) -> Lease | None:
        """Write the revision after `current` (None: the first); the new lease, or None
        when another member wrote that revision first."""
        seq = 0 if current is None else current.seq + 1
        new = Lease(table, seq, member, position, self.now_ms() + self.ttl_ms if member else 0)
        if not record_log.claim(self.store, self._log(table), seq, new.body()):
            return None
        if seq >= 2 and seq % 16 == 0:  # old revisions: pruned now and then
            record_log.prune(self.store, self._log(table), seq - 1)
        return new

    def take(self, table: str, start_position: int) -> Lease | None:
        """Take the partition for this member when it is free or its lease has ended;
        `start_position` is where a group that never read it starts. None: held by a
        live lease, or another member took it first."""
        current = self.lease(table)
        if current is not None and not current.free(self.now_ms()):
            return None
        position = start_position if current is None else current.position
        taken = self.write(current, table, self.member, position)
        if taken is not None and current is not None and current.member is not None:
            # its holder's lease had lapsed: a takeover, not a hand-over
            metrics.TAKEOVERS.labels(metrics.component(), self.name).inc()
        return taken

    def describe(self, tables: list[str]) -> dict[str, Any]:
        """Members and, per partition table, holder and position (no lag)."""
        leases = {t: self.lease(t) for t in tables}
        return {
            "group": self.name,
            "members": self.live_members(),
            "partitions": {
                t: None
                if lease is None
                else {
                    "member": lease.member if not lease.free(self.now_ms()) else None,
                    "position": lease.position,
                }
                for t, lease in leases.items()
            },
        }


@dataclass(frozen=True)
class Changes:
    """What one `Membership.step` changed.

    taken: partitions this member took; lost: partitions it held whose lease another
    member now has, or whose lease ended before a renewal landed (stop using them at
    once); unwanted: partitions it holds that are dealt to another member (stop using
    them, then `release` them).
    """

    taken: list[str]
    lost: list[str]
    unwanted: list[str]


class Membership:
    """A member holding the partitions dealt to it, for a caller that does the work itself
    (a supervisor of child processes, say) and calls `step()` every `tick_s` seconds.

    Each step heartbeats when a third of the lease time has passed since the last, reads
    the group's deal of `partitions` to the live members (`Group.assigned`: recorded and
    sticky), takes those dealt to this member that are free or whose lease ended, and
    renews every held lease that is half spent, those dealt to others too until the
    caller releases them. `step` never blocks on the
    caller's work: the caller stops using an unwanted partition, then calls `release`, so
    the next holder never overlaps it. `leave()` releases everything and removes the
    heartbeat, so the others take over at their next step rather than after `ttl`.
    """

    def __init__(self, group: Group, partitions: list[str], start_position: int = 0) -> None:
        if not partitions:
            raise ConfigError(f"group {group.name}: there are no partitions to share")
        self.group = group
        self.partitions = sorted(partitions)
        self.start_position = start_position
        self.held: dict[str, Lease] = {}
        self.tick_s = min(max(group.ttl_ms / 6000, 0.2), 2.0)
        self._last_heartbeat = 0.0

    @property
    def member(self) -> str:
        return self.group.member

    def heartbeat(self) -> None:
        """Say this member is alive now (steps do it when a third of `ttl` has passed)."""
        self.group.heartbeat()
        self._last_heartbeat = time.monotonic()

    def step(self, take: bool = True) -> Changes:
        """Heartbeat, take (unless `take` is False: a member on its way out), renew (see
        the class); one LIST and, per partition that changes hands or is due for renewal,
        one conditional PUT."""
        if time.monotonic() - self._last_heartbeat >= self.group.ttl_ms / 3000:
            self.heartbeat()
        wanted = set(self.group.assigned(self.partitions, self.group.live_members()))
        lost = [t for t in sorted(self.held) if not self._renew_if_due(t)]
        taken = []
        for table in sorted(wanted - set(self.held) if take else ()):
            lease = self.group.take(table, self.start_position)
            if lease is not None:
                self.held[table] = lease
                taken.append(table)
                log.info("group %s: %s took %s", self.group.name, self.member, table)
        return Changes(taken, lost, sorted(set(self.held) - wanted))

    def _renew_if_due(self, table: str) -> bool:
        lease = self.held[table]
        if lease.expires_ms - self.group.now_ms() < self.group.ttl_ms / 2:
            return self.renew(table)
        return True

    def renew(self, table: str) -> bool:
        """Renew the lease on `table` now; False (and the partition dropped) when the lease
        was lost: another member wrote its next revision, or it ended before this one
        could write it (an outage, a stall), so another member may hold it."""
        lease = self.held[table]
        try:
            renewed = self.group.write(lease, table, self.member, lease.position)
        except Exception as exc:  # noqa: BLE001 - an outage: the lease may lapse, said
            log.warning("group %s: renewing %s failed (%s)", self.group.name, table, exc)
            renewed = lease if lease.expires_ms > self.group.now_ms() else None
        if renewed is None or renewed.expires_ms <= self.group.now_ms():
            del self.held[table]
            log.warning("group %s: %s lost its lease on %s", self.group.name, self.member, table)
            return False
        self.held[table] = renewed
        return True

    def release(self, table: str) -> None:
        """Give up `table` (held): its next revision names no holder."""
        lease = self.held.pop(table)
        try:
            self.group.write(lease, table, None, lease.position)
        except Exception as exc:  # noqa: BLE001 - an unreleased lease ends by itself
            log.warning("group %s: releasing %s failed (%s)", self.group.name, table, exc)
            return
        log.info("group %s: %s released %s", self.group.name, self.member, table)

    def leave(self) -> None:
        """Release every held partition and remove this member's heartbeat."""
        for table in sorted(self.held):
            self.release(table)
        self.group.leave()


def list_groups(lake: Lake) -> list[str]:
    """The groups with members or positions in the lake (one LIST), sorted."""

    def listed() -> list[str]:
        names: set[str] = set()
        for chunk in obstore.list(lake.object_store, prefix=f"{GROUPS_PREFIX}/"):
            for meta in chunk:
                rest = str(meta["path"]).split(f"{GROUPS_PREFIX}/", 1)[-1]
                names.add(rest.split("/", 1)[0])
        return sorted(names)

    return retry_storage(listed, what="list the consumer groups")


def sticky_assignment(
    partitions: list[str], members: list[str], previous: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Deal `partitions` to `members`, moving as few as balance allows (Kafka's sticky
    assignor): every member gets N // M or one more; a member keeps what `previous` dealt
    it up to its share (those holding more get the larger shares first), and only the
    partitions of departed members and the excess of the others go to those under share."""
    ordered, members = sorted(partitions), sorted(members)
    if not members:
        return {}
    known = set(ordered)
    kept = {m: sorted(p for p in previous.get(m, []) if p in known) for m in members}
    base, extra = divmod(len(ordered), len(members))
    by_holding = sorted(members, key=lambda m: (-len(kept[m]), m))
    share = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_holding)}
    dealt = {m: kept[m][: share[m]] for m in members}
    placed = {p for ps in dealt.values() for p in ps}
    free = [p for p in ordered if p not in placed]
    for m in members:
        while len(dealt[m]) < share[m]:
            dealt[m].append(free.pop(0))
    return dealt


def assignment(partitions: list[str], members: list[str], member: str) -> list[str]:
    """The partitions dealt to `member` from nothing held before: partition j of the sorted
    list goes to member j mod N of the sorted live members (none when `member` is not
    among them). Groups deal with `Group.assigned`, which keeps what members hold."""
    ordered = sorted(members)
    if member not in ordered:
        return []
    i, n = ordered.index(member), len(ordered)
    return [t for j, t in enumerate(sorted(partitions)) if j % n == i]
