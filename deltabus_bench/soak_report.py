"""The windowed soak's report: windows.json, windows.md, windows.png and the goals.

Goals (the soak's purpose; each is printed with its figure beside its target, met or not).
Window 1 holds the first maintenance pass and the table state filling up to its
retentions, so the steady goals compare every later window with window 2 (with window 1
when there are only two):

- latency holds: every window's p99 within 15 % of the baseline window's;
- memory holds: no process's resident memory at a window's end more than 10 % above its
  value in the baseline window (a store profile's proxies, which stand in for the
  network, are reported and not judged);
- checkpoints hold: every table's newest checkpoint at most 15 % larger than in the
  baseline window;
- the store holds: once vacuum and log retention are in force, the object count under
  the run's prefix at the last window's end at most 5 % above the first such window's;
- with a records' retention (`--retention-s`), the bytes alike, once retention and
  vacuum have removed a first file.

A missed goal is reported (windows.md, windows.json, the command's output), not an error:
the command fails on lost, repeated or unexpected messages, as every benchmark run does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltabus_bench.histogram import RELATIVE_ERROR
from deltabus_bench.report import write_json
from deltabus_bench.soak_markdown import soak_markdown

P99_DRIFT_MAX = 0.15
RSS_GROWTH_MAX = 0.10
MAINTENANCE = "maintenance"  # the component name of the soak's maintenance passes
OBJECTS_GROWTH_MAX = 0.05
CHECKPOINT_GROWTH_MAX = 0.15

LATENCY_METHOD = (
    "first seen by the consumer minus the message's scheduled send time, per window of send "
    "time; every first sighting goes into a histogram with logarithmic buckets as the "
    "consumer reads it, and a percentile is the order statistic of rank floor(q x (n - 1)) "
    f"within {RELATIVE_ERROR:.0%} of its value; max and mean are exact"
)
NO_PER_MESSAGE = (
    "not done in this mode: no sample is kept, so memory stays flat for any length. No "
    "report.md, report.json, latency_samples table, stage breakdown or per-second series; "
    "messages are accounted for by a sliding bitmap per producer run instead of a join"
)


def maintenance_in_window(events: list[dict], start_ms: float, end_ms: float) -> dict:
    """The maintenance passes that started in [start_ms, end_ms): count, seconds, files,
    and the largest peak resident memory of a pass that ended well (None: no such pass)."""
    passes = [e for e in events if e.get("event") == "pass" and start_ms <= e["start_ms"] < end_ms]
    errors = [e for e in events if e.get("event") == "error" and start_ms <= e["start_ms"] < end_ms]
    peaks = [e["peak_rss_mb"] for e in passes if e.get("peak_rss_mb") is not None]
    return {
        "passes": len(passes),
        "errors": len(errors),
        "seconds": round(sum((e["end_ms"] - e["start_ms"]) / 1000 for e in passes), 1),
        "files_compacted": sum(t["files_compacted"] for e in passes for t in e["tables"]),
        "files_vacuumed": sum(t["files_vacuumed"] for e in passes for t in e["tables"]),
        "peak_rss_mb": max(peaks, default=None),
    }


def set_maintenance_memory(window: dict) -> None:
    """Maintenance's memory in `window` (`rss_mb`, `rss_peak_mb`) becomes its passes' peak,
    or none without a pass that reported one (a failed pass does not): each pass is a
    process of its own, and the scheduler between them holds nothing of the lake. New
    dicts: the monitor's own are left as sampled."""
    if MAINTENANCE not in window["rss_mb"]:
        return
    peak = window["maintenance"]["peak_rss_mb"]
    for key in ("rss_mb", "rss_peak_mb"):
        if key not in window:
            continue
        values = {n: v for n, v in window[key].items() if n != MAINTENANCE}
        if peak is not None:
            values[MAINTENANCE] = peak
        window[key] = values


def in_force_after_s(
    interval_s: float,
    vacuum_hours: float,
    log_retention_s: float | None,
    retention_s: float | None = None,
) -> float:
    """Seconds after window 1 starts from which vacuum, log cleanup and records' retention
    remove as much as is added: the first pass (half an interval in), plus the longest
    retention, plus one more interval for the pass that acts on it."""
    longest = max(vacuum_hours * 3600, float(log_retention_s or 0), float(retention_s or 0))
    return interval_s / 2 + longest + interval_s


def baseline(windows: list[dict]) -> dict:
    """The window the steady goals compare with: window 2, or window 1 when there are two."""
    return windows[1] if len(windows) >= 3 else windows[0]


def evaluate_goals(
    windows: list[dict],
    *,
    interval_s: float,
    vacuum_hours: float,
    log_retention_s: int | None,
    retention_s: int | None = None,
    not_judged: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The goals, each {"goal", "figure", "target", "met" (None: not evaluable), ...}:
    p99, memory, checkpoints, objects and (with `retention_s`) bytes. Processes named in
    `not_judged` are left out of the memory goal (and named in it)."""
    in_force = in_force_after_s(interval_s, vacuum_hours, log_retention_s)
    goals = [
        _p99_goal(windows),
        _rss_goal(windows, not_judged),
        _checkpoint_goal(windows),
        _store_goal(windows, in_force, "objects", OBJECTS_GROWTH_MAX),
    ]
    if retention_s is not None:
        in_force = in_force_after_s(interval_s, vacuum_hours, log_retention_s, retention_s)
        goals.append(_store_goal(windows, in_force, "bytes", OBJECTS_GROWTH_MAX))
    return goals


def _p99_goal(windows: list[dict]) -> dict[str, Any]:
    goal = {
        "goal": "p99 of every later window vs the baseline window's",
        "target": f"within ±{P99_DRIFT_MAX:.0%}",
    }
    if len(windows) < 2:
        return goal | {"met": None, "value": None, "figure": "not evaluated: one window"}
    base = baseline(windows)
    later = [w for w in windows if w["window"] > base["window"] and w["p99_s"] is not None]
    if base["p99_s"] is None or not later:
        return goal | {"met": None, "value": None, "figure": "not evaluated: no p99 to compare"}
    first = base["p99_s"]
    worst = max(later, key=lambda w: abs(w["p99_s"] / first - 1) if first > 0 else 0)
    change = worst["p99_s"] / first - 1 if first > 0 else float("inf")
    low, high = min(w["p99_s"] for w in later), max(w["p99_s"] for w in later)
    return goal | {
        "met": abs(change) <= P99_DRIFT_MAX,
        "value": round(change, 4),
        "figure": (
            f"{first:.3f} s in window {base['window']}; later windows {low:.3f}–{high:.3f} s "
            f"(furthest {change:+.1%}, window {worst['window']})"
        ),
    }


def _rss_goal(windows: list[dict], not_judged: frozenset[str]) -> dict[str, Any]:
    goal: dict[str, Any] = {
        "goal": "resident memory of every process vs the baseline window's",
        "target": f"at most +{RSS_GROWTH_MAX:.0%}",
    }
    if len(windows) < 2:
        return goal | {"met": None, "value": None, "figure": "not evaluated: one window"}
    base = baseline(windows)
    skipped = sorted(n for n in base["rss_mb"] if n in not_judged)
    note = f"; not judged: {', '.join(skipped)} (the store profile's proxies)" if skipped else ""
    absent = sorted({n for w in windows for n in w["rss_mb"]} - set(base["rss_mb"]) - not_judged)
    if absent:  # maintenance, when no pass ended in the baseline window
        note += f"; not judged: {', '.join(absent)} (no figure in the baseline window)"
    goal["not_judged"] = skipped
    growth = _growth(
        windows, base, lambda w: {n: v for n, v in w["rss_mb"].items() if n not in not_judged}
    )
    if not growth:
        return goal | {"met": None, "value": None, "figure": "not evaluated: no process sampled"}
    return goal | _worst(growth, RSS_GROWTH_MAX, "by_process", base, lambda v: f"{v:.0f} MB", note)


def _checkpoint_goal(windows: list[dict]) -> dict[str, Any]:
    goal: dict[str, Any] = {
        "goal": "newest checkpoint of every table vs the baseline window's",
        "target": f"at most +{CHECKPOINT_GROWTH_MAX:.0%}",
    }
    counted = [w for w in windows if w["objects"] is not None]
    if len(counted) < 2:
        return goal | {"met": None, "value": None, "figure": "not evaluated: fewer than 2 counts"}
    base = baseline(counted)

    def sizes(w: dict) -> dict[str, float]:
        tables = w["objects"].get("by_table", {})
        return {t: v["checkpoint_bytes"] for t, v in tables.items() if v.get("checkpoint_bytes")}

    growth = _growth(counted, base, sizes)
    if not growth:
        return goal | {"met": None, "value": None, "figure": "not evaluated: no checkpoint"}
    return goal | _worst(
        growth, CHECKPOINT_GROWTH_MAX, "by_table", base, lambda v: f"{v / 2**20:.2f} MiB"
    )


def _worst(
    growth: dict[str, dict[str, Any]],
    limit: float,
    by: str,
    base: dict,
    unit: Callable[[float], str],
    note: str = "",
) -> dict[str, Any]:
    """A growth goal's verdict: met when the largest growth in `growth` is within
    `limit`, with that largest one as its figure."""
    name, worst = max(growth.items(), key=lambda kv: kv[1]["growth"])
    return {
        "met": worst["growth"] <= limit,
        "value": worst["growth"],
        by: growth,
        "figure": (
            f"largest: {name} {unit(worst['first'])} in window {base['window']} → "
            f"{unit(worst['max_later'])} ({worst['growth']:+.1%}, window {worst['window']})"
            f"{note}"
        ),
    }


def _growth(windows: list[dict], base: dict, values) -> dict[str, dict[str, Any]]:
    """Per name of `values(window)`: its baseline value, its largest value in a later
    window, that window and the growth."""
    out: dict[str, dict[str, Any]] = {}
    for name, first in values(base).items():
        later = [
            (values(w)[name], w["window"])
            for w in windows
            if w["window"] > base["window"] and name in values(w)
        ]
        if not later or first <= 0:
            continue
        top, at = max(later)
        out[name] = {
            "first": first,
            "max_later": top,
            "window": at,
            "growth": round(top / first - 1, 4),
        }
    return out


def _store_goal(windows: list[dict], in_force_s: float, key: str, limit: float) -> dict[str, Any]:
    """Objects or bytes under the run's prefix, from the first window that ends once the
    retentions are in force to the last."""
    what = "objects" if key == "objects" else "bytes"
    goal = {
        "goal": f"{what} under the run's prefix once retention and vacuum are in force",
        "target": f"at most +{limit:.0%} from the first such window to the last",
        "in_force_after_min": round(in_force_s / 60, 1),
    }
    if not windows:
        return goal | {"met": None, "value": None, "figure": "not evaluated: no window"}
    t0 = windows[0]["start_s"]
    counted = [w for w in windows if w["objects"] is not None]
    steady = [w for w in counted if w["end_s"] - t0 >= in_force_s]
    if len(steady) < 2:
        end_min = (windows[-1]["end_s"] - t0) / 60
        return goal | {
            "met": None,
            "value": None,
            "figure": (
                f"not evaluated: in force from {in_force_s / 60:.0f} min after the warm-up, "
                f"and the windows end at {end_min:g} min (a longer soak, or "
                "--vacuum-retention-hours 1)"
            ),
        }
    first, last = steady[0]["objects"][key], steady[-1]["objects"][key]
    change = last / first - 1 if first else float("inf")
    shown = (lambda n: f"{n:,} objects") if key == "objects" else (lambda n: f"{n / 2**30:.2f} GiB")
    return goal | {
        "met": change <= limit,
        "value": round(change, 4),
        "figure": (
            f"{shown(first)} → {shown(last)}, window {steady[0]['window']} → "
            f"{steady[-1]['window']} ({change:+.1%})"
        ),
    }


def goal_lines(goals: list[dict]) -> list[str]:
    """One line per goal: result, figure, target."""
    word = {True: "met", False: "MISSED", None: "not evaluated"}
    return [f"{word[g['met']]}: {g['goal']}: {g['figure']} (target {g['target']})" for g in goals]


# -- the report ------------------------------------------------------------------------------


def build_soak_report(
    cfg,
    soak,
    *,
    machine: str,
    start_ms: float,
    lake_prefix: str,
    log_retention_s: int | None,
    events: list[dict],
    run_errors: list[str],
    notes: list[str],
    whole_run_cpu: dict | None = None,
    whole_run_requests: dict | None = None,
    final: bool,
) -> dict[str, Any]:
    """windows.json: the windows so far (`final`: all of them, the goals, the errors),
    with the run's start (`date`, UTC), `commit` and `cpu` as a benchmark report has them.

    `soak` is the run's `SoakWindows`, `events` the maintenance loop's JSON lines,
    `run_errors` what the driving loop recorded; lost, repeated, unexpected or mistimed
    messages are errors of their own when `final`.
    """
    from deltabus_bench.environment import provenance
    from deltabus_bench.report import store_description
    from deltabus_bench.soak_windows import latency_figures

    windows, warmup, counts = soak.windows()
    for w in windows:
        w["maintenance"] = maintenance_in_window(
            events, start_ms + w["start_s"] * 1000, start_ms + w["end_s"] * 1000
        )
        set_maintenance_memory(w)
    accounting = _accounting(soak, warmup, counts)
    messages = accounting["messages"]
    errors = list(run_errors)
    if final:
        errors += _accounting_errors(accounting)
    passes = [e for e in events if e.get("event") == "pass"]
    report: dict[str, Any] = {
        "mode": "soak in windows",
        "complete": final,
        **provenance(start_ms / 1000),
        "rate": cfg.rates[0],
        "profile": cfg.profile,
        "store": store_description(cfg.store),
        "machine": machine,
        "command": cfg.command,
        "lake_prefix": lake_prefix,
        "schedule_start_ms": start_ms,
        "warmup_s": cfg.warmup,
        "soak_minutes": cfg.soak_minutes,
        "window_minutes": cfg.window_minutes,
        "windows_planned": soak.n,
        "maintenance": {
            "interval_s": cfg.maintenance_interval,
            "vacuum_retention_hours": cfg.vacuum_hours,
            "log_retention_s": log_retention_s,
            "retention_s": cfg.retention_s,
            "passes": len(passes),
            "errors": [e for e in events if e.get("event") == "error"],
        },
        "latency_method": LATENCY_METHOD,
        "per_message_analysis": NO_PER_MESSAGE,
        "goals": evaluate_goals(
            windows,
            interval_s=cfg.maintenance_interval,
            vacuum_hours=cfg.vacuum_hours,
            log_retention_s=log_retention_s,
            retention_s=cfg.retention_s,
            not_judged=frozenset(soak.not_judged),
        ),
        "windows": windows,
        "warmup": warmup,
        "whole_run": {
            "latency": latency_figures(soak.whole_run(), messages),
            "cpu_pct_of_one_core": whole_run_cpu,
            "requests_per_s": whole_run_requests,
        },
        "accounting": accounting,
        "errors": errors,
        "notes": notes,
    }
    return report


def _accounting(soak: Any, warmup: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    """Every message of the windows so far: scheduled, seen, lost, and the sliding
    bitmaps' counts of repeats, late, unexpected and mistimed rows."""
    from deltabus_bench.soak_windows import SEEN_SPAN_S

    hists, _, _ = soak.latency.snapshot()
    messages = sum(soak.latency.expected(k) for k in range(soak.n))
    seen = sum(h.count for h in hists)
    return {
        "messages": messages,
        "seen": seen,
        "lost": messages - seen,
        "warmup_messages": warmup["messages"],
        "lost_during_warmup": warmup["not_seen"],
        "seen_span_s": SEEN_SPAN_S,
        **counts,
    }


def _accounting_errors(a: dict[str, Any]) -> list[str]:
    errors = []
    if a["lost"] or a["lost_during_warmup"]:
        errors.append(
            f"{a['lost'] + a['lost_during_warmup']} message(s) produced but never seen within "
            f"the grace period ({a['lost']} after the warm-up, {a['lost_during_warmup']} "
            "during it)"
        )
    for key, what in (
        ("repeated_or_late", f"rows seen again or more than {a['seen_span_s']:g} s late"),
        ("given_up", "messages not seen while later ones of their run were"),
        ("not_produced", "rows seen that the schedule did not produce"),
        ("retractions", "retractions seen"),
        ("timestamp_mismatches", "parsed timestamps that differ from the schedule"),
    ):
        if a[key]:
            errors.append(f"{what}: {a[key]}")
    return errors


# -- windows.md -----------------------------------------------------------------------------


def write_soak_files(out: Path, report: dict[str, Any]) -> None:
    """windows.json and windows.md in `out`; windows.png too once the run is complete."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "windows.json", report)
    (out / "windows.md").write_text(soak_markdown(report))
    if report["complete"] and report["windows"]:
        from deltabus_bench.plots import soak_windows_plot

        soak_windows_plot(out / "windows.png", report)
