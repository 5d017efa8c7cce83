"""The cost and serving tables of a benchmark report, as Markdown lines, and the number
formats every report table uses."""

from __future__ import annotations

from typing import Any

from deltabus_bench.result_parts import Idle, Serving
from deltabus_bench.results import RunSummary
from deltabus_bench.verdict import KEEPING_UP


def fmt(x: float | None, nd: int = 2) -> str:
    """`x` rounded to `nd` decimals, or "—" for None."""
    return "—" if x is None else f"{round(x, nd) + 0.0:.{nd}f}"  # + 0.0: no "-0.00"


def pair(p50: float | None, p99: float | None, verdict: str | bool = False) -> str:
    """'p50 / p99', with the verdict when the run did not keep up."""
    if p50 is None:
        return "—"
    if verdict is True:
        verdict = "fell behind"  # the anchors' own wording
    suffix = f" ({verdict})" if verdict and verdict != KEEPING_UP else ""
    return f"{fmt(p50)} / {fmt(p99)}{suffix}"


def _or(value: Any, absent: str) -> Any:
    """`value`, or `absent` (the report's mark for a figure not recorded) when None."""
    return absent if value is None else value


def cost_markdown(runs: list[RunSummary]) -> list[str]:
    """The cost table: CPU per million messages per component, requests, bill per day."""
    lines = [
        "## Cost per message",
        "",
        "CPU-seconds per million messages per component (a core fully busy for one second is "
        "one CPU-second), object-store requests per second by class (MinIO's metrics) and the "
        "request bill per day at list prices.",
        "",
        "| backbone | rate | CPU cores in all | CPU-s per M msgs (total: per component) "
        "| requests/s GET / PUT / HEAD / LIST / DELETE / 404s | requests per M msgs | USD/day |",
        "|---|---|---|---|---|---|---|",
    ]
    prices = ""
    for r in runs:
        c = r.cost
        parts = ", ".join(f"{k} {v:g}" for k, v in c.cpu_s_per_million_msgs.items())
        q = c.requests_per_s
        reqs = (
            " / ".join(f"{q.get(k, 0):g}" for k in ("GET", "PUT", "HEAD", "LIST", "DELETE", "404s"))
            + f" (all {q['total']:g})"
            if q
            else "n/a"
        )
        prices = _or(c.prices, prices)
        lines.append(
            f"| {r.backbone} | {r.rate:,} | {_or(c.cpu_cores_total, '—')} | "
            f"{_or(c.cpu_s_per_million_msgs_total, '—')}: {parts} | {reqs} | "
            f"{_or(c.requests_per_million_msgs, 'n/a')} | "
            f"{_or(c.request_cost_usd_per_day, 'n/a')} |"
        )
    for r in runs:
        if r.cost.idle:
            lines += _idle_lines(r, r.cost.idle)
    if prices:
        lines += ["", f"Prices: {prices}."]
    return lines


def _idle_lines(r: RunSummary, idle: Idle) -> list[str]:
    """The idle pipeline after run `r` (`--idle-s`): its CPU and requests, the first
    messages after it, and, over more than a minute, its CPU minute by minute."""
    cpu = idle.cpu_pct_of_one_core
    busy = sum(v for k, v in cpu.items() if not k.startswith("machine"))
    q = idle.requests_per_s or {}
    first = idle.first_after_idle_s
    lines = [
        f"\nIdle ({r.backbone}, after the {r.rate:,} msg/s run, "
        f"{idle.seconds:g} s without traffic): {busy:.1f} % of one core in all "
        f"({', '.join(f'{k} {v}' for k, v in cpu.items())}), "
        f"{q.get('total', 'n/a')} requests/s"
        + (
            f"; the first messages sent after it: latency {first:.2f} s"
            f" ({idle.producer_start_to_seen_s or 0:.2f} s from starting a producer)."
            if first is not None
            else "; the first messages sent after it were not seen within 30 s."
        )
    ]
    if len(idle.by_minute) > 1:
        lines.append(
            "Idle by minute, % of one core in all (MinIO): "
            + ", ".join(f"{w['all']} ({w.get('minio', '—')})" for w in idle.by_minute)
            + ". MinIO's data scanner visits what the traffic wrote in its first "
            "cycle after it: the first minute carries that deferred cost."
        )
    return lines


def serving_markdown(runs: list[RunSummary]) -> list[str]:
    """--serve postgres|opensearch: the stage unified commit → served (visible in
    PostgreSQL, searchable in OpenSearch), with the verdict and CPU of the sink and of the
    store, one table per backend (empty without --serve)."""
    from deltabus_bench.config import SERVE_SYSTEMS

    served = [(r, r.serving) for r in runs if r.serving is not None]
    lines: list[str] = []
    for backend in dict.fromkeys(s.backend for _, s in served):
        system = SERVE_SYSTEMS.get(backend, backend)
        mine = [(r, s) for r, s in served if s.backend == backend]
        if backend == "opensearch":
            first = mine[0][1]
            how = (
                "searchable in OpenSearch (a reader polling the index for versions it has not "
                "seen; the sink acknowledges a batch once searchable, with "
                f"{first.in_flight or 1} batch(es) in flight, refresh interval "
                f"{first.refresh_interval_ms} ms)"
            )
        else:
            how = f"visible in {system} (a reader polling the served table)"
        lines += [
            "",
            f"Serving stage (`--serve {backend}`): unified commit → {how}, p50 / p99 (s); "
            f"the verdict applies the keeping-up rule to sent → served in {system}.",
            "",
            f"| backbone | rate | unified commit→{system} | sent→{system} | not served "
            "| verdict | CPU % of one core |",
            "|---|---|---|---|---|---|---|",
        ]
        for r, s in mine:
            st, e2e = s.stage, s.end_to_end
            cpu = ", ".join(f"{k} {v}" for k, v in s.cpu_pct_of_one_core.items())
            lines.append(
                f"| {r.backbone} | {r.rate:,} | {pair(st.p50, st.p99)} | "
                f"{pair(e2e.p50, e2e.p99)} | {s.not_served:,} | {s.verdict} | "
                f"{cpu or '—'} |"
            )
        lines += _raw_lines(mine)
        lines += _replay_lines(system, mine)
    return lines


def _raw_lines(mine: list[tuple[RunSummary, Serving]]) -> list[str]:
    """OpenSearch: the node's own rate before each run (plain `_bulk`, no sink)."""
    raws = [(r.rate, s.raw_capacity) for r, s in mine if s.raw_capacity]
    if not raws:
        return []
    rates = ", ".join(f"{rate:,}: {raw['docs_per_s']:,.0f}{_node_cpu(raw)}" for rate, raw in raws)
    return [
        "",
        "The node alone before each run (plain `_bulk` requests of served-shape documents "
        "from one client, nothing else running), documents/s by the run's rate: " + rates,
    ]


def _node_cpu(raw: dict) -> str:
    cpu = raw.get("node_cpu_s_per_million_docs")
    return "" if cpu is None else f" ({cpu:g} CPU-s per million in the node)"


def _replay_lines(system: str, mine: list[tuple[RunSummary, Serving]]) -> list[str]:
    """`--serve-replay`: the sink alone loading the unified table, one row per run."""
    replays = [(r.rate, s.replay) for r, s in mine if s.replay is not None]
    if not replays:
        return []
    lines = [
        "",
        f"The sink alone (`--serve-replay`): after the run, with nothing else running, "
        f"a fresh sink loaded the unified table's net content into {system}; the "
        "standalone rate counts its whole run (start, reading the table, loading).",
        "",
        "| run's rate | rows | seconds | rows/s | CPU-s: sink / server |",
        "|---|---|---|---|---|",
    ]
    for rate, rp in replays:
        lines.append(
            f"| {rate:,} | {rp.rows or 0:,} | {rp.elapsed_s} | "
            f"{rp.rows_per_s or 0:,} | {rp.sink_cpu_s} / "
            f"{'—' if rp.server_cpu_s is None else rp.server_cpu_s} |"
        )
    return lines
