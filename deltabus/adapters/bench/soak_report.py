"""The windowed soak's report: windows.json, windows.md, windows.png and the goals.

Goals (the soak's purpose; each is printed with its figure beside its target, met or not):

- latency holds: the last window's p99 within 15 % of the first window's (windows start
  after the warm-up);
- memory holds: no process's resident memory at a window's end more than 10 % above its
  value at the end of the first window (a store profile's proxies, which stand in for the
  network, are reported and not judged);
- the store holds: once vacuum and log retention are in force, the object count under
  the run's prefix at the last window's end at most 5 % above the first such window's.

A missed goal is reported (windows.md, windows.json, the command's output), not an error:
the command fails on lost, repeated or unexpected messages, as every benchmark run does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltabus.adapters.bench.histogram import RELATIVE_ERROR
from deltabus.adapters.bench.report import write_json
from deltabus.adapters.bench.soak_markdown import soak_markdown

P99_DRIFT_MAX = 0.15
RSS_GROWTH_MAX = 0.10
OBJECTS_GROWTH_MAX = 0.05

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
    """The maintenance passes that started in [start_ms, end_ms): count, seconds, files."""
    passes = [e for e in events if e.get("event") == "pass" and start_ms <= e["start_ms"] < end_ms]
    errors = [e for e in events if e.get("event") == "error" and start_ms <= e["start_ms"] < end_ms]
    return {
        "passes": len(passes),
        "errors": len(errors),
        "seconds": round(sum((e["end_ms"] - e["start_ms"]) / 1000 for e in passes), 1),
        "files_compacted": sum(t["files_compacted"] for e in passes for t in e["tables"]),
        "files_vacuumed": sum(t["files_vacuumed"] for e in passes for t in e["tables"]),
    }


def in_force_after_s(
    interval_s: float, vacuum_hours: float, log_retention_s: float | None
) -> float:
    """Seconds after window 1 starts from which vacuum and log cleanup remove as much as is
    added: the first pass (half an interval in), plus the longer retention, plus one more
    interval for the pass that acts on it."""
    retention = max(vacuum_hours * 3600, float(log_retention_s or 0))
    return interval_s / 2 + retention + interval_s


def evaluate_goals(
    windows: list[dict],
    *,
    interval_s: float,
    vacuum_hours: float,
    log_retention_s: int | None,
    not_judged: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The three goals, each {"goal", "figure", "target", "met" (None: not evaluable), ...};
    processes named in `not_judged` are left out of the memory goal (and named in it)."""
    return [
        _p99_goal(windows),
        _rss_goal(windows, not_judged),
        _objects_goal(windows, in_force_after_s(interval_s, vacuum_hours, log_retention_s)),
    ]


def _p99_goal(windows: list[dict]) -> dict[str, Any]:
    goal = {
        "goal": "p99 of the last window vs the first",
        "target": f"within ±{P99_DRIFT_MAX:.0%}",
    }
    if len(windows) < 2 or windows[0]["p99_s"] is None or windows[-1]["p99_s"] is None:
        return goal | {"met": None, "value": None, "figure": "not evaluated: no p99 in both"}
    first, last = windows[0]["p99_s"], windows[-1]["p99_s"]
    change = last / first - 1 if first > 0 else float("inf")
    return goal | {
        "met": abs(change) <= P99_DRIFT_MAX,
        "value": round(change, 4),
        "figure": f"{first:.3f} s → {last:.3f} s ({change:+.1%}), window 1 → {len(windows)}",
    }


def _rss_goal(windows: list[dict], not_judged: frozenset[str]) -> dict[str, Any]:
    goal: dict[str, Any] = {
        "goal": "resident memory of every process after the first window",
        "target": f"at most +{RSS_GROWTH_MAX:.0%} over its first window's",
    }
    if len(windows) < 2:
        return goal | {"met": None, "value": None, "figure": "not evaluated: one window"}
    skipped = sorted(n for n in windows[0]["rss_mb"] if n in not_judged)
    note = f"; not judged: {', '.join(skipped)} (the store profile's proxies)" if skipped else ""
    goal["not_judged"] = skipped
    growth: dict[str, dict[str, Any]] = {}
    for name, base in windows[0]["rss_mb"].items():
        if name in not_judged:
            continue
        later = [(w["rss_mb"][name], w["window"]) for w in windows[1:] if name in w["rss_mb"]]
        if not later or base <= 0:
            continue
        top, at = max(later)
        growth[name] = {
            "first_mb": base,
            "max_later_mb": top,
            "window": at,
            "growth": round(top / base - 1, 4),
        }
    if not growth:
        return goal | {"met": None, "value": None, "figure": "not evaluated: no process sampled"}
    name, worst = max(growth.items(), key=lambda kv: kv[1]["growth"])
    return goal | {
        "met": worst["growth"] <= RSS_GROWTH_MAX,
        "value": worst["growth"],
        "by_process": growth,
        "figure": (
            f"largest: {name} {worst['first_mb']:.0f} → {worst['max_later_mb']:.0f} MB "
            f"({worst['growth']:+.1%}, window {worst['window']}){note}"
        ),
    }


def _objects_goal(windows: list[dict], in_force_s: float) -> dict[str, Any]:
    goal = {
        "goal": "objects under the run's prefix once retention and vacuum are in force",
        "target": f"at most +{OBJECTS_GROWTH_MAX:.0%} from the first such window to the last",
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
    first, last = steady[0]["objects"]["objects"], steady[-1]["objects"]["objects"]
    change = last / first - 1 if first else float("inf")
    return goal | {
        "met": change <= OBJECTS_GROWTH_MAX,
        "value": round(change, 4),
        "figure": (
            f"{first:,} → {last:,} objects, window {steady[0]['window']} → "
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
    """windows.json: the windows so far (`final`: all of them, the goals, the errors).

    `soak` is the run's `SoakWindows`, `events` the maintenance loop's JSON lines,
    `run_errors` what the driving loop recorded; lost, repeated, unexpected or mistimed
    messages are errors of their own when `final`.
    """
    from deltabus.adapters.bench.report import store_description
    from deltabus.adapters.bench.soak_windows import latency_figures

    windows, warmup, counts = soak.windows()
    for w in windows:
        w["maintenance"] = maintenance_in_window(
            events, start_ms + w["start_s"] * 1000, start_ms + w["end_s"] * 1000
        )
    accounting = _accounting(soak, warmup, counts)
    messages = accounting["messages"]
    errors = list(run_errors)
    if final:
        errors += _accounting_errors(accounting)
    passes = [e for e in events if e.get("event") == "pass"]
    report: dict[str, Any] = {
        "mode": "soak in windows",
        "complete": final,
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
    from deltabus.adapters.bench.soak_windows import SEEN_SPAN_S

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
        from deltabus.adapters.bench.plots import soak_windows_plot

        soak_windows_plot(out / "windows.png", report)
