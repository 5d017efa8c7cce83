"""Store profiles: a latency-injecting proxy in front of the benchmark's MinIO.

A profile is a per-request latency distribution to add to a loopback MinIO, with the
source of its numbers (docs/benchmarks/method.md, "Store profiles";
docs/adr/0003-store-profiles.md):

- loopback: nothing in between (MinIO on this machine, about 1 ms a request);
- s3-express: S3 Express One Zone, "single-digit millisecond" first-byte latency;
- s3-standard: S3 Standard, median in the tens of milliseconds with a long tail.

The base of each profile is toxiproxy (`github.com/Shopify/toxiproxy/v2`, pinned, built
with `go install` and cached as MinIO is): a `latency` toxic per direction. toxiproxy
cannot shape a per-request tail (its jitter is uniform and per chunk; its toxicity is
drawn per connection), so a profile with a tail puts deltabus_bench.latency_proxy, an
HTTP/1.1-aware stage that delays single requests, in front of toxiproxy:

    client -> tail stage (s3-standard only) -> toxiproxy -> MinIO

The proxies bind 127.0.0.1 and need a plain-http upstream. `StoreProxy` starts and stops
them; `measure` times requests through an endpoint with the client deltabus' hot paths
use (obstore); `python -m deltabus_bench.store_profiles build` builds toxiproxy.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltabus.adapters.dev.minio_process import cache_dir
from deltabus.core.errors import ConfigError, DeltabusError
from deltabus.core.net import free_port
from deltabus.core.processes import spawn
from deltabus_bench.latency_proxy import SlowRequests

log = logging.getLogger(__name__)

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
TOXIPROXY_VERSION = "v2.12.0"  # `@latest` resolves to v2.5.0: pin the version
TOXIPROXY_BIN_VAR = "DELTABUS_TOXIPROXY_BIN"


@dataclass(frozen=True)
class Latency:
    """One toxiproxy `latency` toxic: every chunk of bytes in `stream` (upstream: client
    to store; downstream: store to client) waits `latency_ms` plus a whole number of
    milliseconds drawn uniformly from [-jitter_ms, jitter_ms - 1]."""

    stream: str
    latency_ms: int
    jitter_ms: int = 0

    def sample_ms(self, rng: random.Random) -> float:
        """One draw, as toxiproxy 2.12 makes it (toxics/latency.go)."""
        jitter = rng.randrange(2 * self.jitter_ms) - self.jitter_ms if self.jitter_ms else 0
        return float(self.latency_ms + jitter)


@dataclass(frozen=True)
class StoreProfile:
    """A per-request latency added in front of MinIO: the toxiproxy toxics (base) plus,
    when `tail` is set, the tail stage's per-request extra delay. `summary` is the line
    reports print; `source` what the numbers rest on."""

    name: str
    summary: str
    source: str
    toxics: tuple[Latency, ...] = ()
    tail: SlowRequests | None = None

    @property
    def proxied(self) -> bool:
        return bool(self.toxics) or self.tail is not None

    def sample_ms(self, rng: random.Random) -> float:
        """One request's injected delay as modelled (MinIO's own time not included): one
        draw per toxic plus the tail's. A request or an answer of several chunks waits
        about the largest of its chunks' draws, a little more than one draw."""
        base = sum(t.sample_ms(rng) for t in self.toxics)
        return base + (self.tail.sample_ms(rng) if self.tail else 0.0)

    def modelled_ms(self, draws: int = 200_000, seed: int = 0) -> dict[str, float]:
        """p50/p90/p99/p99.9/max of the injected delay over `draws` modelled requests."""
        rng = random.Random(seed)
        return summarise(
            [self.sample_ms(rng) for _ in range(draws)], ("p50", "p90", "p99", "p99.9")
        )

    def describe(self) -> dict[str, Any]:
        """The profile as reports record it."""
        out: dict[str, Any] = {"profile": self.name, "summary": self.summary}
        if self.proxied:
            out["toxiproxy"] = [
                {"stream": t.stream, "latency_ms": t.latency_ms, "jitter_ms": t.jitter_ms}
                for t in self.toxics
            ]
            if self.tail:
                out["tail"] = {
                    "probability": self.tail.probability,
                    "median_ms": self.tail.median_ms,
                    "sigma": self.tail.sigma,
                    "max_ms": self.tail.max_ms,
                }
        return out


PROFILES: dict[str, StoreProfile] = {
    p.name: p
    for p in (
        StoreProfile(
            "loopback",
            "MinIO on loopback, nothing in between",
            "this machine",
        ),
        StoreProfile(
            "s3-express",
            "about 3-5 ms a request (injected: 2-3 ms)",
            "AWS: S3 Express One Zone gives single-digit millisecond first-byte latency",
            toxics=(Latency("upstream", 1), Latency("downstream", 2, 1)),
        ),
        StoreProfile(
            "s3-standard",
            "median about 27 ms, p99 about 180 ms a request (injected: 15-34 ms uniform, "
            "plus for 3 % of requests a log-normal extra of median 120 ms)",
            "AWS S3 performance guidelines: small requests see median latencies in the tens "
            "of milliseconds, and a request unanswered after 2 s is worth retrying; a "
            "published measurement of S3 Standard GETs: time to first byte about 30 ms, "
            "80 ms tails rather common",
            toxics=(Latency("upstream", 10), Latency("downstream", 15, 10)),
            tail=SlowRequests(probability=0.03, median_ms=120.0, sigma=0.5, max_ms=1500.0),
        ),
    )
}


def profile(name: str) -> StoreProfile:
    """The profile called `name` (ConfigError naming the choices otherwise)."""
    try:
        return PROFILES[name.strip().lower()]
    except KeyError:
        raise ConfigError(
            f"--store {name!r} is not a store profile", f"use one of {', '.join(PROFILES)}"
        ) from None


# -- toxiproxy: build, cache, run ------------------------------------------------------


def find_toxiproxy() -> Path | None:
    """`$DELTABUS_TOXIPROXY_BIN`, else the pinned build in the cache."""
    explicit = os.environ.get(TOXIPROXY_BIN_VAR)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    cached = cache_dir() / "bin" / f"toxiproxy-server-{TOXIPROXY_VERSION}"
    return cached if cached.is_file() else None


def build_toxiproxy() -> Path:
    """Build the pinned toxiproxy server with `go install` into the cache (once)."""
    found = find_toxiproxy()
    if found:
        return found
    go = shutil.which("go")
    if go is None:
        raise DeltabusError(
            "toxiproxy is not built and Go is not available to build it",
            f"install Go, or set {TOXIPROXY_BIN_VAR} to a toxiproxy-server {TOXIPROXY_VERSION}",
        )
    target = cache_dir() / "bin"
    target.mkdir(parents=True, exist_ok=True)
    final = target / f"toxiproxy-server-{TOXIPROXY_VERSION}"
    log.info("building toxiproxy %s into %s", TOXIPROXY_VERSION, target)
    with tempfile.TemporaryDirectory(dir=target, prefix=".toxiproxy-") as tmp:
        env = {**os.environ, "GOBIN": tmp, "CGO_ENABLED": "0"}
        subprocess.run(
            [go, "install", f"{TOXIPROXY_MODULE}@{TOXIPROXY_VERSION}"], check=True, env=env
        )
        os.replace(Path(tmp) / "server", final)  # `go install` names it after its package
    return final


def _api(base: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read()
    return json.loads(text) if text else None


def _wait_port(port: int, proc: subprocess.Popen, what: str, log_path: Path) -> None:
    import socket

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeltabusError(f"{what} exited with status {proc.returncode}", f"see {log_path}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise DeltabusError(f"{what} did not listen on 127.0.0.1:{port} within 15 s", f"see {log_path}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class StoreProxy:
    """The proxies of `profile` in front of `upstream` (an http:// MinIO endpoint), on free
    loopback ports. `endpoint` is what clients use instead of `upstream`; for the
    loopback profile it is `upstream` itself and nothing is started.

    `seed` fixes toxiproxy's and the tail stage's draws. Logs go to `workdir`.
    """

    def __init__(
        self,
        profile: StoreProfile,
        upstream: str,
        workdir: Path,
        *,
        seed: int = 0,
        binary: Path | None = None,
    ) -> None:
        scheme, _, hostport = upstream.rstrip("/").partition("://")
        if profile.proxied and (scheme != "http" or ":" not in hostport):
            raise ConfigError(
                f"--store {profile.name} needs a plain http://HOST:PORT MinIO, got {upstream}",
                "use --local-minio, or a MinIO endpoint without TLS",
            )
        self.profile = profile
        self.upstream = upstream.rstrip("/")
        self._upstream_hostport = hostport
        self.workdir = Path(workdir)
        self.seed = seed
        self.binary = binary
        self.toxiproxy: subprocess.Popen | None = None
        self.tail_stage: subprocess.Popen | None = None
        self.endpoint = self.upstream
        self.tail_counts: dict[str, int] | None = None  # the tail stage's, after stop()

    @property
    def pids(self) -> dict[str, int]:
        """The proxies' pids by name (empty for loopback)."""
        procs = {"toxiproxy": self.toxiproxy, "tail stage": self.tail_stage}
        return {name: p.pid for name, p in procs.items() if p is not None}

    def start(self) -> StoreProxy:
        if not self.profile.proxied:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_toxiproxy()
            if self.profile.tail is not None:
                self._start_tail_stage()
        except BaseException:
            self.stop()
            raise
        log.info(
            "store profile %s: clients use %s (MinIO at %s)",
            self.profile.name,
            self.endpoint,
            self.upstream,
        )
        return self

    def _start_toxiproxy(self) -> None:
        binary = self.binary or build_toxiproxy()
        api_port, listen = free_port(), free_port()
        log_path = self.workdir / f"toxiproxy-{api_port}.log"
        self.toxiproxy = spawn(
            [str(binary), "-host", "127.0.0.1", "-port", str(api_port), "-seed", str(self.seed)],
            log_path,
            # A line per connection and per closed link otherwise: errors only.
            env={**os.environ, "LOG_LEVEL": "error"},
        )
        _wait_port(api_port, self.toxiproxy, "toxiproxy", log_path)
        api = f"http://127.0.0.1:{api_port}"
        name = f"minio-{uuid.uuid4().hex[:6]}"
        _api(
            api,
            "/proxies",
            {
                "name": name,
                "listen": f"127.0.0.1:{listen}",
                "upstream": self._upstream_hostport,
                "enabled": True,
            },
        )
        for i, toxic in enumerate(self.profile.toxics):
            _api(
                api,
                f"/proxies/{name}/toxics",
                {
                    "name": f"{toxic.stream}-{i}",
                    "type": "latency",
                    "stream": toxic.stream,
                    "toxicity": 1.0,
                    "attributes": {"latency": toxic.latency_ms, "jitter": toxic.jitter_ms},
                },
            )
        self.endpoint = f"http://127.0.0.1:{listen}"

    def _start_tail_stage(self) -> None:
        tail = self.profile.tail
        assert tail is not None
        port = free_port()
        log_path = self.workdir / f"tail-stage-{port}.log"
        self._tail_out = self.workdir / f"tail-stage-{port}.json"
        self._tail_out.write_bytes(b"")  # the counts of this stage only
        self.tail_stage = spawn(
            [sys.executable, "-m", "deltabus_bench.latency_proxy", "--port", str(port)]
            + ["--upstream", self.endpoint.removeprefix("http://")]
            + ["--probability", repr(tail.probability), "--median-ms", repr(tail.median_ms)]
            + ["--sigma", repr(tail.sigma), "--max-ms", repr(tail.max_ms)]
            + ["--seed", str(self.seed)],
            log_path,
            stdout_path=self._tail_out,
        )
        _wait_port(port, self.tail_stage, "the tail stage", log_path)
        self.endpoint = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        """Stop the proxies (the tail stage first: it reports its counts on the way out)."""
        if self.tail_stage is not None:
            _stop(self.tail_stage)
            try:
                lines = self._tail_out.read_text().splitlines()
                self.tail_counts = json.loads(lines[-1]) if lines else None
            except (OSError, ValueError):
                self.tail_counts = None
            self.tail_stage = None
        _stop(self.toxiproxy)
        self.toxiproxy = None
        self.endpoint = self.upstream

    def __enter__(self) -> StoreProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- statistics of latencies ---------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of ascending values (q in 0..1)."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def summarise(values: list[float], keys: tuple[str, ...] = ("p50", "p90", "p99")) -> dict:
    """{"n", p.. keys, "max"} of `values` (ms), rounded to 0.1 ms."""
    ordered = sorted(values)
    out: dict[str, float] = {"n": len(ordered)}
    for key in keys:
        out[key] = round(percentile(ordered, float(key[1:]) / 100), 1)
    out["max"] = round(ordered[-1], 1)
    return out


def main(argv: list[str]) -> None:
    """`python -m deltabus_bench.store_profiles build`: build toxiproxy, print its path."""
    if argv != ["build"]:
        raise SystemExit("usage: python -m deltabus_bench.store_profiles build")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build_toxiproxy())


if __name__ == "__main__":
    main(sys.argv[1:])
