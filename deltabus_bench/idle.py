"""What idling costs: the pipeline's CPU and requests with no traffic, and what the first
messages after an idle window wait."""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.compute as pc

from deltabus.delta.lake import Lake
from deltabus_bench.cost import RequestMeter
from deltabus_bench.delta.consumer import DeltaUnifiedConsumer, PartitionedConsumer
from deltabus_bench.drivers import AFTER_IDLE_RUN
from deltabus_bench.environment import CpuMeter

log = logging.getLogger("deltabus_bench")

IDLE_WINDOW_S = 60.0  # the idle cost is also reported per window of this length
AFTER_IDLE_COUNT = 10


def measure_idle(pids: dict[str, int], seconds: float, requests: RequestMeter | None) -> dict:
    """CPU and requests of the running pipeline with no traffic (what idling costs).

    Also per minute (`by_minute`, % of one core in all): MinIO's data scanner visits
    the folders the traffic changed in the first cycle after it, about a minute, so
    the first minute carries a deferred cost of the traffic and the later ones show
    what idling itself costs.
    """
    watched = {n: pid for n, pid in pids.items() if not n.startswith("producer")}

    def meter() -> CpuMeter:
        m = CpuMeter()
        for name, pid in watched.items():
            m.watch(name, pid)
        m.start()
        return m

    log.info("measuring the idle pipeline for %g s", seconds)
    idle = meter()
    if requests:
        requests.start()
    by_minute: list[dict[str, float]] = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        window = meter()
        time.sleep(min(IDLE_WINDOW_S, left))
        window.stop()
        by_minute.append(window.report())
    idle.stop()
    out: dict = {
        "seconds": seconds,
        "cpu_pct_of_one_core": idle.report(),
        "by_minute": [
            {
                "all": round(sum(v for k, v in w.items() if not k.startswith("machine")), 1),
                **{k: v for k, v in w.items() if not k.startswith("machine")},
            }
            for w in by_minute
        ],
    }
    if requests:
        requests.stop()
        out["requests_per_s"] = requests.per_second()
    return out


def first_after_idle(
    lake: Lake, consumer: DeltaUnifiedConsumer | PartitionedConsumer, commit_interval: float
) -> dict | None:
    """What the first messages after the idle window wait (their tails had backed off):
    `first_after_idle_s`, their end-to-end latency as every sample's (seen minus
    scheduled send time), and `producer_start_to_seen_s`, from starting a producer
    (which opens its tables first) until the consumer saw them all. None when they
    did not arrive within 30 s."""
    from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer

    seen = consumer.inserted
    config = ProducerConfig(
        rate=1000,
        count=AFTER_IDLE_COUNT,
        commit_interval=commit_interval,
        run_id=AFTER_IDLE_RUN,
    )
    sent = time.monotonic()
    TimezoneProducer(lake, config).run()
    deadline = sent + 30
    while consumer.inserted < seen + AFTER_IDLE_COUNT:
        if time.monotonic() > deadline or consumer.error is not None:
            return None
        time.sleep(0.002)
    waited = round(time.monotonic() - sent, 3)
    rows = consumer.table()
    probe = rows.filter(
        pc.starts_with(rows.column("message").cast(pa.string()), f"{AFTER_IDLE_RUN}-")
    )
    latency = pc.subtract(probe.column("seen_ms"), probe.column("timestamp"))
    first = round(pc.max(latency).as_py() / 1000, 3)
    log.info(
        "first messages after the idle window: latency %.3f s (%.3f s from starting a producer)",
        first,
        waited,
    )
    return {"first_after_idle_s": first, "producer_start_to_seen_s": waited}
