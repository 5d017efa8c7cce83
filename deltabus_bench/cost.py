"""What a message costs: CPU per component and object-store requests, as a paid store bills.

Time figures depend on the machine; these carry over between machines. Requests are read
from MinIO's own Prometheus metrics (`/minio/metrics/v3/api/requests`, live counters, served
without auth by the
throwaway MinIO the benchmark starts with `MINIO_PROMETHEUS_AUTH_TYPE=public`), before and
after the measured window, so they count every request of every component.
"""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

from deltabus_bench.result_parts import Cost, Idle

# Public list prices of a large cloud object store (S3 Standard, us-east-1), USD per 1,000
# requests: PUT, COPY, POST and LIST at 0.005; GET, HEAD and the rest at 0.0004; DELETE free.
PRICE_PER_1000 = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "OTHER": 0.0004}
PRICES_NOTE = (
    "USD per 1,000 requests at S3 Standard us-east-1 list prices: PUT/COPY/POST/LIST 0.005, "
    "GET/HEAD/other 0.0004, DELETE free; storage and transfer not included"
)
OPERATIONS = ("GET", "PUT", "HEAD", "LIST", "DELETE", "OTHER")

_LINE = re.compile(
    r'^(minio_api_requests(?:_4xx_errors)?_total)\{name="([^"]+)"[^}]*type="s3"[^}]*\}\s+(\S+)$'
)


def operation(api: str) -> str:
    """MinIO's API name (GetObject, ListObjectsV2, ...) -> the billing class."""
    api = api.lower()
    if api.startswith("list"):
        return "LIST"
    if api in ("getobject", "getobjectattributes", "selectobjectcontent"):
        return "GET"
    if api in ("headobject", "headbucket"):
        return "HEAD"
    if api in ("putobject", "copyobject", "putobjectpart", "completemultipartupload"):
        return "PUT"
    if api.startswith("delete"):
        return "DELETE"
    return "OTHER"


def parse_metrics(text: str) -> dict[str, float]:
    """Request counts by billing class, plus `404s` (4xx answers to GET/HEAD: a miss)."""
    counts = dict.fromkeys((*OPERATIONS, "404s"), 0.0)
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        name, api, value = m.group(1), m.group(2), float(m.group(3))
        if name.endswith("4xx_errors_total"):
            if operation(api) in ("GET", "HEAD"):
                counts["404s"] += value
        else:
            counts[operation(api)] += value
    return counts


class RequestMeter:
    """Object-store requests between `start()` and `stop()`, from MinIO's metrics."""

    def __init__(self, endpoint: str) -> None:
        self.url = f"{endpoint.rstrip('/')}/minio/metrics/v3/api/requests"
        self._before: dict[str, float] | None = None
        self._after: dict[str, float] | None = None
        self._t0 = self._t1 = 0.0

    def scrape(self) -> dict[str, float] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                return parse_metrics(response.read().decode())
        except OSError:
            return None

    def start(self) -> None:
        self._before, self._t0 = self.scrape(), time.monotonic()

    def stop(self) -> None:
        self._after, self._t1 = self.scrape(), time.monotonic()

    def per_second(self) -> dict[str, float] | None:
        """Requests per second by class over the window (None when metrics were unreadable)."""
        if self._before is None or self._after is None or self._t1 <= self._t0:
            return None
        wall = self._t1 - self._t0
        rates = {k: round((self._after[k] - self._before[k]) / wall, 2) for k in self._after}
        rates["total"] = round(sum(rates[k] for k in OPERATIONS), 2)
        return rates


def daily_request_cost(per_second: dict[str, float]) -> float:
    """USD per day for this request mix at `PRICE_PER_1000`."""
    per_day = {k: per_second.get(k, 0.0) * 86_400 for k in PRICE_PER_1000}
    return round(sum(per_day[k] / 1000 * PRICE_PER_1000[k] for k in PRICE_PER_1000), 2)


def cost_summary(
    cpu_pct: dict[str, float],
    rate: float,
    requests_per_s: dict[str, float] | None,
    idle: Idle | None = None,
) -> Cost:
    """CPU-seconds per million messages per component, requests per second and per million
    messages, the request bill per day at list prices, and `idle` as measured."""
    components = {k: v for k, v in cpu_pct.items() if not k.startswith("machine")}
    per_million = {name: round(pct / 100 / rate * 1_000_000, 1) for name, pct in components.items()}
    # The whole machine: busy, stolen by the hypervisor and waiting for the disk (iowait),
    # on average and in the worst second.
    machine = {k.removeprefix("machine_"): v for k, v in cpu_pct.items() if k.startswith("machine")}
    requests: dict[str, Any] = {}
    if requests_per_s is not None:
        requests = {
            "requests_per_s": requests_per_s,
            "requests_per_million_msgs": round(requests_per_s["total"] / rate * 1_000_000, 1),
            "request_cost_usd_per_day": daily_request_cost(requests_per_s),
            "prices": PRICES_NOTE,
        }
    return Cost(
        cpu_pct_of_one_core=components,
        cpu_s_per_million_msgs=per_million,
        cpu_s_per_million_msgs_total=round(sum(per_million.values()), 1),
        cpu_cores_total=round(sum(components.values()) / 100, 2),
        machine=machine,
        idle=idle,
        **requests,
    )
