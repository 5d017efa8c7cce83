"""Hosts on one machine for tests: Linux network namespaces joined by a bridge, whose links
a test cuts under real processes. Needs root (CAP_NET_ADMIN) and iproute2's `ip`.

One `Lab` is:

- a switch namespace `<lab>-sw` holding the bridge `br0`, with one port `p<i>` per host;
- host namespaces `<lab>-h<i>` (i = 1..n), each with `lo` up and `eth0` (the peer of
  `p<i>`) at `10.251.<x>.<i>/24`;
- in the root namespace, the observer link `<lab>o` at `10.251.<x>.254/24`, so the test
  itself reaches the hosts (health checks, reads of the lake).

No namespace gets a default route and the root namespace only a route to the lab's /24,
so traffic goes between the lab's own addresses and nowhere else (no NAT, no
forwarding). `<x>` is chosen so that no route or address of the root namespace overlaps
the /24. Cutting host i sets its switch port down: the host keeps its address and its
own loopback, as when a cable is pulled. Lab names carry the creating pid
(`dbmh<pid>`), so `reap_stale()` removes what a killed test run left behind.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import psutil

PREFIX = "dbmh"
SUBNET_BASE = "10.251"
OBSERVER_HOST = 254
_LAB_NAME = re.compile(rf"^{PREFIX}(\d+)(?:-|o$)")


def missing() -> str | None:
    """Why labs cannot be made here (None: they can): root and `ip` are needed."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`; raises with its stderr when it fails and `check`."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    """The network namespaces `ip netns` knows."""
    out = ip("-j", "netns", "list").stdout.strip()
    return [entry["name"] for entry in json.loads(out)] if out else []


def ns_pids(ns: str) -> list[int]:
    """The pids of the processes in namespace `ns` (none when it is gone)."""
    done = ip("netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def kill_namespace_processes(ns: str, grace_s: float = 10.0) -> None:
    """SIGTERM every process in `ns`, then SIGKILL those left after `grace_s`."""
    pids = ns_pids(ns)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := ns_pids(ns)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while ns_pids(ns) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _root_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace routes or has an address in."""
    nets: list[ipaddress.IPv4Network] = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            try:
                nets.append(ipaddress.IPv4Network(dst, strict=False))
            except ValueError:
                continue
    for link in json.loads(ip("-j", "-4", "addr").stdout or "[]"):
        for addr in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", False))
    return nets


def free_subnet(start: int) -> int:
    """The third octet x of a 10.251.x.0/24 that overlaps nothing the root namespace
    routes or holds, trying x = start, start + 1, ... (mod 200, from 20)."""
    taken = _root_networks()
    for i in range(200):
        x = 20 + (start + i) % 200
        net = ipaddress.IPv4Network(f"{SUBNET_BASE}.{x}.0/24")
        if not any(net.overlaps(other) for other in taken):
            return x
    raise RuntimeError(f"no free {SUBNET_BASE}.x.0/24 subnet")


def reap_stale() -> list[str]:
    """Remove the namespaces and observer links of labs whose creating process is gone;
    returns what was removed."""
    removed = []
    names = namespaces()
    links = [link["ifname"] for link in json.loads(ip("-j", "link", "show").stdout or "[]")]
    for name in [*names, *links]:
        found = _LAB_NAME.match(name)
        if found is None or psutil.pid_exists(int(found.group(1))):
            continue
        if name in names:
            if name.endswith("-sw"):
                continue  # after its hosts, below
            kill_namespace_processes(name, grace_s=2)
            ip("netns", "del", name, check=False)
        else:
            ip("link", "del", name, check=False)
        removed.append(name)
    for name in names:
        found = _LAB_NAME.match(name)
        if found and name.endswith("-sw") and not psutil.pid_exists(int(found.group(1))):
            ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


class Lab:
    """`hosts` network namespaces on one bridge (see the module); `destroy()` removes
    every namespace, link and process of it, also when `create` failed half way."""

    def __init__(self, hosts: int, name: str | None = None) -> None:
        if not 1 <= hosts <= 200:
            raise ValueError(f"a lab has 1..200 hosts, got {hosts}")
        self.name = name or f"{PREFIX}{os.getpid()}"
        self.hosts = hosts
        self.switch = f"{self.name}-sw"
        self.observer_link = f"{self.name}o"
        self.subnet = free_subnet(os.getpid())
        self.created: list[str] = []

    def ns(self, host: int) -> str:
        """The namespace of host `host` (1-based)."""
        return f"{self.name}-h{host}"

    def address(self, host: int) -> str:
        return f"{SUBNET_BASE}.{self.subnet}.{host}"

    @property
    def observer_address(self) -> str:
        return f"{SUBNET_BASE}.{self.subnet}.{OBSERVER_HOST}"

    def port(self, host: int) -> str:
        """Host `host`'s port on the bridge (in the switch namespace)."""
        return f"p{host}"

    def create(self) -> Lab:
        """Make the switch, the hosts and the observer link; on any failure, remove what
        was made and raise."""
        try:
            self._add_ns(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for host in range(1, self.hosts + 1):
                ns = self.ns(host)
                self._add_ns(ns)
                port = self.port(host)
                ip(
                    *("-n", ns, "link", "add", "eth0", "type", "veth"),
                    *("peer", "name", port, "netns", self.switch),
                )
                ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                self._bridge(port)
            ip(
                *("link", "add", self.observer_link, "type", "veth"),
                *("peer", "name", "po", "netns", self.switch),
            )
            ip("addr", "add", f"{self.observer_address}/24", "dev", self.observer_link)
            ip("link", "set", self.observer_link, "up")
            self._bridge("po")
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        ip("netns", "add", ns)
        self.created.append(ns)
        ip("-n", ns, "link", "set", "lo", "up")

    def _bridge(self, port: str) -> None:
        """Make `port` (in the switch namespace) a port of the bridge, up."""
        ip("-n", self.switch, "link", "set", port, "master", "br0")
        ip("-n", self.switch, "link", "set", port, "up")

    def exec_prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program on host `host`."""
        return ["ip", "netns", "exec", self.ns(host)]

    def popen(self, host: int, args: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Start `args` on host `host` (`ip netns exec` execs it: the pid is the program's)."""
        return subprocess.Popen([*self.exec_prefix(host), *args], **popen)

    def cut(self, host: int) -> None:
        """Pull host `host`'s cable: its bridge port goes down."""
        ip("-n", self.switch, "link", "set", self.port(host), "down")

    def restore(self, host: int) -> None:
        """Plug host `host`'s cable back in."""
        ip("-n", self.switch, "link", "set", self.port(host), "up")

    def pids(self, host: int) -> list[int]:
        return ns_pids(self.ns(host))

    def destroy(self) -> None:
        """Stop every process of every host, then remove the observer link and the
        namespaces (idempotent; never raises for what is already gone)."""
        hosts = [ns for ns in self.created if ns.startswith(f"{self.name}-h")]
        for ns in hosts:
            kill_namespace_processes(ns)
        ip("link", "del", self.observer_link, check=False)
        for ns in [*hosts, self.switch]:
            if ns in self.created:
                kill_namespace_processes(ns, grace_s=2)
                ip("netns", "del", ns, check=False)
        self.created = []

    def __enter__(self) -> Lab:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
