"""report.json (read by the Dagster asset), report.md and the anchors they compare to."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deltabus_bench.anchors import ANCHORS, profile_key
from deltabus_bench.report_tables import cost_markdown, fmt, pair, serving_markdown
from deltabus_bench.results import RunDetail, RunSummary
from deltabus_bench.verdict import KEEPING_UP

# The keys of a row of report.json's `runs` (RunSummary.to_dict), before `serving`.
RUN_KEYS = (
    "rate",
    "backbone",
    "etl",
    "samples",
    "messages",
    "lost",
    "p50",
    "p75",
    "p85",
    "p95",
    "p99",
    "p99.9",
    "max",
    "achieved_rate",
    "max_lag_s",
    "verdict",
    "fell_behind",
    "stages",
    "cost",
)


# Steal or I/O wait in the worst second above this (% of all cores) gets a report note.
STALL_NOTE_PCT = 10.0


def store_description(store: str) -> dict[str, Any]:
    """The store profile as report.json records it: {"profile": name, "summary": ...} and,
    for a proxied profile, its toxiproxy toxics and tail (bench.store_profiles)."""
    from deltabus_bench.store_profiles import profile as store_profile

    return store_profile(store).describe()


def store_line(store: str) -> str:
    """report.md's line naming the store profile."""
    from deltabus_bench.store_profiles import TOXIPROXY_VERSION
    from deltabus_bench.store_profiles import profile as store_profile

    chosen = store_profile(store)
    if not chosen.proxied:
        return f"- store: {chosen.name} ({chosen.summary})"
    parts = f"toxiproxy {TOXIPROXY_VERSION}" + (
        " and a per-request tail stage" if chosen.tail else ""
    )
    return (
        f"- store: **{chosen.name}**, {chosen.summary}; {parts} between every component and "
        "MinIO (their CPU is not in the cost; the machine's busy share includes it)"
    )


# report.md's names of the ETLs (BenchConfig.etl).
ETL_NAMES = {
    "pathway": "pathway (deltabus' ETL process)",
    "spark": "**spark** (Spark Structured Streaming: Delta streaming source and sink, "
    "trigger processingTime = the commit interval)",
    "kafka-streams": "**kafka-streams** (a Kafka Streams topology, exactly-once v2, commit "
    "interval = the commit interval)",
}


def etl_line(runs: list[RunSummary]) -> str:
    """report.md's line naming the ETL of each backbone's runs."""
    parts = []
    for backbone in sorted({r.backbone for r in runs}):
        etls = sorted({r.etl for r in runs if r.backbone == backbone}) or ["pathway"]
        names = ", ".join(ETL_NAMES.get(e, e) for e in etls)
        parts.append(f"{names} on {backbone}" if len({r.backbone for r in runs}) > 1 else names)
    return "- ETL: " + "; ".join(parts or [ETL_NAMES["pathway"]])


def report_json(
    profile: str, machine: str, command: str, runs: list[RunSummary], store: str = "loopback"
) -> dict[str, Any]:
    """Exactly {date, commit, cpu, profile, store, machine, command, runs: [...],
    highest_keeping_up_rate} with the documented run keys; `store` as
    `store_description` gives it, `date` is when the report was written (UTC)."""
    from deltabus_bench.environment import provenance

    report = {
        **provenance(),
        "profile": profile,
        "store": store_description(store),
        "machine": machine,
        "command": command,
        "runs": [run.to_dict() for run in runs],
        "highest_keeping_up_rate": highest_keeping_up(
            (r.backbone, r.rate, r.verdict) for r in runs
        ),
    }
    serving = [(r.rate, r.serving) for r in runs if r.serving is not None]
    for backend in dict.fromkeys(s.backend for _, s in serving):
        # --serve postgres|opensearch: the sink's own verdict
        report["highest_keeping_up_rate"][f"{backend} serving"] = highest_keeping_up(
            ("s", rate, s.verdict) for rate, s in serving if s.backend == backend
        ).get("s")
    return report


def highest_keeping_up(runs: Iterable[tuple[str, int, str]]) -> dict[str, int | None]:
    """Per backbone of the (backbone, rate, verdict) of runs, the highest rate whose run
    kept up (over-bound and behind runs do not count), or None."""
    best: dict[str, int | None] = {}
    for backbone, rate, verdict in runs:
        current = best.get(backbone)
        best[backbone] = max(rate, current or 0) if verdict == KEEPING_UP else current
    return best


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON, one trailing newline (values JSON lacks as strings)."""
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def console_text(
    profile: str, machine: str, command: str, runs: list[RunSummary], store: str = "loopback"
) -> str:
    """What `deltabus bench` prints: report.md's summary, its cost table and, with
    --serve, its serving stage, rendered from the runs (report.json's `runs` will do)."""
    return "\n".join(
        [
            *summary_lines(profile, machine, command, runs, store),
            "",
            *cost_markdown(runs),
            *serving_markdown(runs),
        ]
    ).rstrip()


def summary_lines(
    profile: str, machine: str, command: str, runs: list[RunSummary], store: str = "loopback"
) -> list[str]:
    """report.md's title, what was run, and the end-to-end latency beside the anchors."""
    backbones = sorted({r.backbone for r in runs}, key=lambda b: (b != "delta", b))
    rates = sorted({r.rate for r in runs})
    pk = profile_key(profile)
    other = "1000ms" if pk == "100ms" else "100ms"
    by = {(r.backbone, r.rate): r for r in runs}
    lines = [
        "# deltabus latency benchmark",
        "",
        f"- profile: commit every {profile} (producer and ETL)",
        etl_line(runs),
        store_line(store),
        f"- machine: {machine}",
        f"- command: `{command}`",
        "- latency: consumer first sees the row in the unified output minus the message's "
        "scheduled send time; percentiles over the samples after the warm-up (seconds).",
        "",
        "## End-to-end latency vs the anchors",
        "",
    ]
    head = ["rate msg/s"]
    for b in backbones:
        spark = any(r.etl == "spark" for r in runs if r.backbone == b)
        head.append(
            f"deltabus{' + Spark ETL' if spark else ''} commit {pk} p50 / p99 (s)"
            if b == "delta"
            else "Kafka p50 / p99 (s)"
        )
    head += [f"anchor commit {pk} p50 / p99 (s)", f"anchor commit {other} p50 / p99 (s)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rate in rates:
        row = [f"{rate:,}"]
        for b in backbones:
            r = by.get((b, rate))
            row.append(pair(r.p50, r.p99, r.verdict) if r else "—")
        for key in (pk, other):
            a = ANCHORS.get(key, {}).get(rate)
            row.append(pair(a[0], a[1], a[2]) if a else "—")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def report_markdown(
    profile: str,
    machine: str,
    command: str,
    details: list[RunDetail],
    plots: dict[str, str],
    notes: list[str],
    store: str = "loopback",
) -> str:
    """report.md: the summary, every percentile, the cost, the stages, the serving stage,
    each run's details (`plots` by run key, and "rates"), and `notes`."""
    runs = [d.summary for d in details]
    lines = summary_lines(profile, machine, command, runs, store)
    lines += [
        "",
        "## All percentiles",
        "",
        "| backbone | rate | samples | messages | lost | p50 | p75 | p85 | p95 | p99 | p99.9 "
        "| max | achieved msg/s | max producer lag s | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.backbone} | {r.rate:,} | {r.samples:,} | {r.messages:,} | {r.lost:,} | "
            + " | ".join(fmt(x) for x in (r.p50, r.p75, r.p85, r.p95, r.p99, r.p99_9, r.max))
            + f" | {r.achieved_rate:,.0f} | {fmt(r.max_lag_s, 3)} | {r.verdict} |"
        )
    lines += ["", *cost_markdown(runs)]
    lines += [
        "",
        "## Where the time goes (stage medians and p99s, seconds)",
        "",
        "Segments: sent → input commit (Delta `_commit_timestamp` of the input version; Kafka "
        "log-append time) → ETL processed (Pathway `time`) → unified commit (Delta "
        "`_commit_timestamp`; Kafka log-append time) → seen by the consumer.",
        "",
        "| backbone | rate | sent→input commit | input commit→ETL | ETL→unified commit "
        "| unified commit→seen | end to end |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        cells = [pair(st.p50, st.p99) for st in r.stages.values()]
        lines.append(
            f"| {r.backbone} | {r.rate:,} | " + " | ".join(cells) + f" | {pair(r.p50, r.p99)} |"
        )
    lines += serving_markdown(runs)
    lines += ["", "## Run details", ""]
    for d in details:
        lines += _run_details(d, plots.get(d.summary.key))
    if plots.get("rates"):
        lines += ["## Percentiles versus rate", "", f"![percentiles vs rate]({plots['rates']})", ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _run_details(d: RunDetail, plot: str | None) -> list[str]:
    """A run's section of report.md: its verdict and why, CPU, lost messages, errors, the
    backlog drain, the soak, and its latency plot."""
    r, behind = d.summary, d.behind
    lines = [f"### {r.backbone} at {r.rate:,} msg/s", ""]
    lines.append(
        f"- verdict: **{r.verdict}** (backlog when producing ended "
        f"{behind.backlog_at_end_s} s, quarter p50s {behind.quarter_p50_s} s, "
        f"p50 trend {behind.slope_s_per_s} s/s, p99 bound {behind.p99_bound_s:g} s; "
        f"rule: {behind.rule})"
    )
    if d.cpu:
        cpu = ", ".join(f"{k} {v}%" for k, v in d.cpu.items())
        lines.append(f"- CPU during the load (% of one core): {cpu}")
    if d.lost_examples:
        lines.append(f"- **lost messages** (e.g. {', '.join(d.lost_examples)})")
    for name, items in (("checks failed", d.checks_failed), ("errors", d.errors)):
        lines += [f"- **{name}**: {item}" for item in items]
    if d.drain:
        lines.append(_drain_line(d))
    if d.soak:
        sk = d.soak
        q = "; ".join(f"Q{x.quarter} {fmt(x.p50)} / {fmt(x.p99)}" for x in sk.quarters)
        lines.append(
            f"- soak: {sk.maintenance_passes} maintenance passes; p50 / p99 per quarter: {q}"
        )
        if sk.tables:
            lines.append(f"- tables at the end: {sk.tables}")
    if plot:
        lines += ["", f"![latency over time]({plot})"]
    lines.append("")
    return lines


def _drain_line(d: RunDetail) -> str:
    """report.md's line on a run's backlog drain."""
    dr = d.drain
    assert dr is not None
    restart = f", restart took {dr.restart_ready_s} s" if dr.restart_ready_s else ""
    return (
        f"- backlog drain ({dr.signal}): {_drained(d)} down {dr.down_s} s{restart}, "
        f"{dr.backlog_messages:,} messages backlog, peak latency "
        f"{dr.peak_latency_s} s; backlog drained {dr.backlog_drained_s} s after "
        f"the resumption; back under {dr.threshold_s} s after "
        f"{dr.recovery_s_p99} s (p99) / {dr.recovery_s_p50} s (p50), under twice "
        f"the pre-outage p99 ({dr.baseline_p99_s} s) after "
        f"{dr.recovery_s_to_2x_baseline_p99} s (None: not within the run. Rule: "
        f"{dr.rule})"
    )


def write_reports(out: Path, cfg: Any, machine: str, details: list[RunDetail]) -> dict[str, Any]:
    """report.json, report.md and the plots of a benchmark in `out`; returns report.json
    with "errors": every run's, prefixed with its backbone and rate."""
    from deltabus_bench.plots import latency_over_time, percentiles_vs_rate

    runs = [d.summary for d in details]
    plots: dict[str, str] = {}
    for d in details:
        r = d.summary
        name = f"latency-{r.key}.png"
        outage = None
        if d.drain:
            outage = (d.drain.down_at_s, d.drain.down_at_s + (d.drain.down_s or 0))
        latency_over_time(
            out / name,
            f"{r.backbone} at {r.rate:,} msg/s"
            + (f", commit {cfg.profile}" if r.backbone == "delta" else ""),
            d.over_time,
            cfg.warmup,
            outage=outage,
            marks=d.soak.maintenance_at_s if d.soak else None,
        )
        plots[r.key] = name
    percentiles_vs_rate(out / "percentiles-vs-rate.png", cfg.profile, runs)
    plots["rates"] = "percentiles-vs-rate.png"
    notes = _report_notes(details)
    report = report_json(cfg.profile, machine, cfg.command, runs, cfg.store)
    write_json(out / "report.json", report)
    (out / "report.md").write_text(
        report_markdown(cfg.profile, machine, cfg.command, details, plots, notes, cfg.store)
    )
    report["errors"] = [
        f"{d.summary.backbone} {d.summary.rate}: {e}" for d in details for e in d.errors
    ]
    return report


def _report_notes(details: list[RunDetail]) -> list[str]:
    """report.md's notes: the runs' own, a CPU-saturated machine, and a worst second in
    which steal or I/O wait reached `STALL_NOTE_PCT`."""
    notes = [n for d in details for n in d.notes]
    if any(d.cpu.get("machine_busy_pct_of_all_cores", 0) > 95 for d in details):
        notes.append("the machine was CPU-saturated during at least one run (see CPU lines)")
    for d in details:
        for kind, what in (("steal", "the hypervisor took"), ("iowait", "waiting for the disk:")):
            worst = d.cpu.get(f"machine_{kind}_worst_second_pct", 0)
            if worst >= STALL_NOTE_PCT:
                notes.append(
                    f"{d.summary.backbone} at {d.summary.rate:,} msg/s: {what} {worst:g} % of "
                    f"the CPUs in the worst second ({kind}); a stall in every stage at once may "
                    "be that"
                )
    return notes


def _drained(d: RunDetail) -> str:
    """Which ETL a backlog drain took down: the one, or process 0 of several."""
    n = d.etl_processes
    return f"ETL process 0 (of {n})" if n > 1 else "ETL"
