"""Loopback networking: free ports, and a GET that answers None when nothing listens."""

from __future__ import annotations

import random
import socket
import urllib.error
import urllib.request


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux's default when
    it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def restartable_port() -> int:
    """A free loopback port outside the ephemeral range, for a server that is stopped
    and started again on it.

    A client retrying a stopped server on a port of that range can be given the same port
    as its own source and connect to itself, holding the port so the server cannot bind
    it again."""
    low, _ = ephemeral_range()
    candidates = list(range(10_000, max(10_001, low)))
    random.shuffle(candidates)
    for port in candidates[:500]:
        if not port_taken(port):
            return port
    return free_port()


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (all held open at once while choosing)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_taken(port: int) -> bool:
    """True when something already listens on (or holds) `port` on 127.0.0.1."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def http_get(url: str, timeout: float = 2) -> tuple[int | None, dict[str, str]]:
    """Status and lower-cased headers of a GET; (None, {}) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}
    except OSError:
        return None, {}
