"""A soak's report as Markdown (windows.md) and as the console summary."""

from __future__ import annotations

from typing import Any


def _v(x: Any, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def soak_markdown(report: dict[str, Any], plot: bool = True) -> str:
    """windows.md: the goals, then per window latency and the store, CPU per component,
    resident memory per process, and the accounting of messages; `plot`: with the link
    to windows.png when the run is complete."""
    windows = report["windows"]
    lines = _summary_lines(report)
    lines += _by_name(windows, "cpu_pct_of_one_core", "CPU per component (% of one core)", "{:.1f}")
    memory = (
        "Resident memory per process (MB at the window's end; maintenance: the peak of the"
        " window's passes, each a process of its own)"
    )
    lines += _by_name(windows, "rss_mb", memory, "{:.0f}")
    lines += _checkpoint_lines(windows)
    lines += _accounting_lines(report)
    if report["complete"] and plot:
        lines += ["", "![p50 / p99, resident memory and objects per window](windows.png)"]
    return "\n".join(lines) + "\n"


def soak_section(report: dict[str, Any], name: str) -> list[str]:
    """A soak as a section of the results page: `name`, the run's date, commit and CPU,
    then windows.md without its title and plot, each heading one level under `name`'s."""
    body = soak_markdown(report, plot=False).splitlines()[1:]
    lines = [
        f"### {name}",
        "",
        f"Started {report['date']}, commit {report['commit']}, {report['cpu']}.",
    ]
    return lines + ["##" + line if line.startswith("## ") else line for line in body]


def soak_console(report: dict[str, Any]) -> str:
    """What `deltabus bench` prints at the end of a soak: the run, its goals and the
    per-window latency and store table (windows.md has the rest)."""
    return "\n".join(_summary_lines(report))


def _summary_lines(report: dict[str, Any]) -> list[str]:
    """The title, the run's description, the goals and the per-window latency table."""
    m = report["maintenance"]
    state = "" if report["complete"] else " (in progress: windows so far)"
    lines = [
        f"# deltabus soak in windows{state}",
        "",
        f"- rate: {report['rate']:,} msg/s, commit every {report['profile']}, store "
        f"{report['store']['profile']}",
        f"- {report['soak_minutes']:g} min after a {report['warmup_s']:g} s warm-up, in "
        f"{report['windows_planned']} windows of {report['window_minutes']:g} min",
        f"- maintenance every {m['interval_s']:g} s from half an interval into window 1 "
        f"(compact, checkpoint, log cleanup, vacuum with {m['vacuum_retention_hours']} h "
        f"retention); log retention {_v(m['log_retention_s'], '{} s')}; records' retention "
        f"{_v(m.get('retention_s'), '{} s')}; passes "
        f"{m['passes']}, errors {len(m['errors'])}",
        f"- machine: {report['machine']}",
        f"- command: `{report['command']}`",
        f"- latency: {report['latency_method']}",
        f"- per-message analysis: {report['per_message_analysis']}",
        "",
        "## Goals",
        "",
        "| goal | figure | target | result |",
        "|---|---|---|---|",
    ]
    word = {True: "met", False: "**missed**", None: "not evaluated"}
    for g in report["goals"]:
        lines.append(f"| {g['goal']} | {g['figure']} | {g['target']} | {word[g['met']]} |")
    return lines + _window_lines(report)


def _window_lines(report: dict[str, Any]) -> list[str]:
    """Per window: latency, messages, objects and bytes, requests by class, load."""
    lines = [
        "",
        "## Latency, the store and the machine per window",
        "",
        "Latency in seconds, by send time; objects and bytes under the run's prefix at the "
        "window's end; requests per second by class from MinIO's metrics over the window "
        "(the monitor's own listings left out); the 1-minute load average sampled every "
        "second (mean and max).",
        "",
        "| window | minutes after warm-up | messages | seen | not seen | p50 | p99 | max "
        "| objects | MiB "
        "| GET / PUT / HEAD / LIST / DELETE per s | load mean (max) | maintenance passes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in report["windows"]:
        o, q, load = w["objects"], w["requests_per_s"], w["load_average"]
        reqs = (
            " / ".join(f"{q.get(c, 0):g}" for c in ("GET", "PUT", "HEAD", "LIST", "DELETE"))
            if q
            else "n/a"
        )
        flag = "" if w["complete"] else " (cut short)"
        lines.append(
            f"| {w['window']}{flag} | {_minutes(w['start_s'] - report['warmup_s'])}–"
            f"{_minutes(w['end_s'] - report['warmup_s'])} | "
            f"{w['messages']:,} | {w['seen']:,} | {w['not_seen']:,} | {_v(w['p50_s'])} | "
            f"{_v(w['p99_s'])} | {_v(w['max_s'])} | "
            f"{'n/a' if o is None else format(o['objects'], ',')} | "
            f"{'n/a' if o is None else format(o['bytes'] / 2**20, ',.1f')} | {reqs} | "
            f"{_v(load['1m_mean'], '{:.2f}')} ({_v(load['1m_max'], '{:.2f}')}) | "
            f"{w['maintenance']['passes']} |"
        )
    return lines


def _accounting_lines(report: dict[str, Any]) -> list[str]:
    """Every message accounted for, the whole run's latency, errors and notes."""
    a = report["accounting"]
    lines = [
        "",
        "## Messages",
        "",
        f"- scheduled after the warm-up {a['messages']:,}, seen {a['seen']:,}, not seen "
        f"{a['lost']:,} (during the warm-up: {a['lost_during_warmup']:,} of "
        f"{a['warmup_messages']:,})",
        f"- rows read {a['rows_seen']:,}; repeated or later than "
        f"{a['seen_span_s']:g} s behind their run {a['repeated_or_late']:,}; given up "
        f"{a['given_up']:,}; not produced by the schedule {a['not_produced']:,}; "
        f"retractions {a['retractions']:,}; timestamps off the schedule "
        f"{a['timestamp_mismatches']:,}",
    ]
    whole = report["whole_run"]["latency"]
    lines.append(
        f"- all windows together: p50 {_v(whole['p50_s'])} s, p99 {_v(whole['p99_s'])} s, "
        f"p99.9 {_v(whole['p99.9_s'])} s, max {_v(whole['max_s'])} s"
    )
    for e in report["errors"]:
        lines.append(f"- **error**: {e}")
    for n in report.get("notes", []):
        lines.append(f"- note: {n}")
    return lines


def _checkpoint_lines(windows: list[dict]) -> list[str]:
    """Per window, the size of every table's newest checkpoint (MiB)."""
    sized = [
        {
            "window": w["window"],
            "checkpoint": {
                t: v.get("checkpoint_bytes", 0) / 2**20 for t, v in w["objects"]["by_table"].items()
            },
        }
        for w in windows
        if w["objects"] is not None
    ]
    if not sized:
        return []
    return _by_name(
        sized, "checkpoint", "Newest checkpoint per table (MiB at the window's end)", "{:.2f}"
    )


def _minutes(seconds: float) -> str:
    return f"{round(seconds / 60, 2):g}"


def _by_name(windows: list[dict], key: str, title: str, fmt: str) -> list[str]:
    names: list[str] = []
    for w in windows:
        for n in w[key]:
            if n not in names:
                names.append(n)
    extra = key == "cpu_pct_of_one_core"
    head = ["window", *names] + (["machine busy % of all cores"] if extra else [])
    lines = ["", f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in windows:
        row = [str(w["window"])] + [_v(w[key].get(n), fmt) for n in names]
        if extra:
            row.append(_v(w["machine_busy_pct_of_all_cores"], "{:.1f}"))
        lines.append("| " + " | ".join(row) + " |")
    return lines
