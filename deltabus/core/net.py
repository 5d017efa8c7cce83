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


def restartable_port(span: int = 1) -> int:
    """A loopback port P, with P .. P+span-1 all free, outside the ephemeral range, for a
    server that binds them later or is stopped and started again on them.

    The kernel hands ports of that range to outgoing connections as their source: a
    port of it that is free when asked can be taken before the server binds it, or a
    client retrying a stopped server can connect to itself on it."""
    low, _ = ephemeral_range()
    candidates = list(range(10_000, max(10_001, low - span + 1)))
    random.shuffle(candidates)
    for port in candidates[:500]:
        if not any(port_taken(port + i) for i in range(span)):
            return port
    if span == 1:
        return free_port()
    raise OSError(f"no {span} consecutive free loopback ports below {low}")


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
