"""`deltabus serve postgres|opensearch --lease`: replicas of one sink, active and standby.

The replicas of one sink (one served table or index on one server) are the members of
one group in the lake (deltabus.bus.groups.Membership) that shares a single partition,
`ACTIVE`: its holder serves, the others wait. A target keeps one position for the whole
unified table, so there is nothing to split between replicas; a standby's worth is that
it takes over within the lease time when the active one dies, and goes on from the
position stored in the target (docs/adr/0046-transforms-links-and-sinks-by-lease.md).

Exactly once never depends on the lease: the target moves its position only from the
one a write expects (`PositionMovedError` otherwise), so an active replica that lost its
lease but has not noticed yet cannot apply a version twice or skip one.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from deltabus.adapters.lease_supervisor import check_ttl
from deltabus.bus.groups import DEFAULT_TTL_S, Changes, Group, Membership, check_group
from deltabus.core import health
from deltabus.delta.lake import Lake

log = logging.getLogger(__name__)

ACTIVE = "active"  # the one partition of a sink's group
LOOP_S = 0.1  # how often an active replica looks at its stop event

# Serves until the event is set; returns the sink's report.
Serve = Callable[[threading.Event], dict[str, Any]]


def lease_group(kind: str, name: str, target: str) -> str:
    """The group of the replicas of sink `kind` ("postgres", "opensearch") serving `name`
    (a table, an index) on `target` (the server as the sink describes it, no secret):
    the same for every replica given the same settings, another for another server."""
    digest = hashlib.sha256(f"{kind}\n{name}\n{target}".encode()).hexdigest()[:8]
    return check_group(f"serve.{kind}.{name[:60].lower()}.{digest}")


class SinkLease:
    """One replica of a sink: serves while it holds the group's `ACTIVE` lease, waits
    while another replica holds it.

    Args:
        lake: the lake the group lives in.
        group: the group's name (`lease_group`).
        ttl_s: an active replica not heard from for this long loses the lease.
    """

    def __init__(self, lake: Lake, group: str, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.group = group
        self.membership = Membership(Group(lake, group, check_ttl(ttl_s)), [ACTIVE])
        self.active_periods = 0

    @property
    def member(self) -> str:
        return self.membership.member

    def run(self, stop: threading.Event, serve: Serve) -> dict[str, Any]:
        """Wait for the lease, serve while it is held (again after a loss), until `stop`
        is set; then release the lease and leave the group, so a standby takes over at
        its next step. Reports ready (health) once it has joined, active or standby.

        Returns:
            The report of the last time this replica served (empty if it never did),
            with `lease_group`, `member` and `active_periods`.

        Raises:
            What `serve` raises; the lease is released first.
        """
        log.info(
            "sink replica %s joins group %s (lease %gs)",
            self.member,
            self.group,
            self.membership.group.ttl_ms / 1000,
        )
        report: dict[str, Any] = {}
        # Heartbeat first and deal one step later: replicas started together see each
        # other before one takes the lease.
        self.membership.heartbeat()
        health.mark_ready()
        waiting_logged = False
        try:
            while not stop.wait(self.membership.tick_s):
                if self._step() is None or ACTIVE not in self.membership.held:
                    if not waiting_logged:
                        log.info("sink replica %s is standby", self.member)
                        waiting_logged = True
                    continue
                waiting_logged = False
                self.active_periods += 1
                log.info("sink replica %s holds the lease: serving", self.member)
                report = self._serve_while_held(stop, serve)
                if not stop.is_set():
                    log.warning("sink replica %s stopped serving: the lease moved", self.member)
        finally:
            self.membership.leave()
            log.info("sink replica %s left group %s", self.member, self.group)
        return {
            **report,
            "lease_group": self.group,
            "member": self.member,
            "active_periods": self.active_periods,
        }

    def _step(self) -> Changes | None:
        """One membership step; None when it failed (the lease then lapses by the clock
        unless a later step renews it)."""
        try:
            return self.membership.step()
        except Exception as exc:  # noqa: BLE001 - an outage: the lease lapses by the clock
            log.warning("group %s: step failed (%s); retrying", self.group, exc)
            return None

    def _serve_while_held(self, stop: threading.Event, serve: Serve) -> dict[str, Any]:
        """Run `serve` while a thread keeps the lease; the sink stops (after its current
        write) when `stop` is set or the lease is lost or dealt to another replica."""
        serving = threading.Event()
        keeper = threading.Thread(
            target=self._keep, args=(stop, serving), name="sink-lease", daemon=True
        )
        keeper.start()
        try:
            return serve(serving)
        finally:
            serving.set()
            keeper.join()
            if ACTIVE in self.membership.held and not stop.is_set():
                self.membership.release(ACTIVE)  # dealt to another replica

    def _keep(self, stop: threading.Event, serving: threading.Event) -> None:
        """Renew the lease every step; set `serving` when `stop` is set, the lease is lost
        or ended, or the group deals it to another replica."""
        next_step = time.monotonic() + self.membership.tick_s
        while not serving.wait(LOOP_S):
            if stop.is_set():
                serving.set()
                return
            if time.monotonic() < next_step:
                continue
            changes = self._step()
            next_step = time.monotonic() + self.membership.tick_s
            lease = self.membership.held.get(ACTIVE)
            if lease is None or lease.expires_ms <= self.membership.group.now_ms():
                self.membership.held.pop(ACTIVE, None)
                log.warning("group %s: %s lost the lease", self.group, self.member)
                serving.set()
            elif changes is not None and ACTIVE in changes.unwanted:
                serving.set()
