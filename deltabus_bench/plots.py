"""PNG plots (matplotlib, Agg backend): latency over time per run, percentiles vs rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltabus_bench.anchors import ANCHORS, profile_key
from deltabus_bench.results import RunSummary


def _plt() -> Any:
    """pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_over_time(
    path: Path,
    title: str,
    series: list[dict],
    warmup_s: float = 0.0,
    *,
    outage: tuple[float, float] | None = None,
    marks: list[float] | None = None,
) -> Path:
    """p50/p95/p99 per interval of send time; warm-up shaded, outage and maintenance marked.

    The one latency plot of the project (the benchmark and the Dagster latency asset).
    Uses matplotlib's object API, not pyplot's global state, so threads can plot at once.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), dpi=100)
    ax = fig.add_subplot()
    t = [r["t_s"] for r in series]
    marker = "." if len(t) < 60 else None
    for key, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
        ax.plot(t, [r[key] for r in series], style, marker=marker, label=key, linewidth=1.5)
    if warmup_s > 0:
        ax.axvspan(0, warmup_s, color="grey", alpha=0.15, label="warm-up (discarded)")
    if outage:
        ax.axvspan(outage[0], outage[1], color="red", alpha=0.12, label="ETL down")
    for i, m in enumerate(marks or []):
        ax.axvline(
            m, color="green", alpha=0.5, linewidth=0.8, label="maintenance" if i == 0 else None
        )
    ax.set_xlabel("send time since start (s)")
    ax.set_ylabel("latency (s)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def percentiles_vs_rate(path: Path, profile: str, runs: list[RunSummary]) -> Path:
    """p50/p95/p99/max against rate per backbone, with the profile's anchors as markers."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    colors = {"p50": "tab:blue", "p95": "tab:orange", "p99": "tab:red", "max": "tab:grey"}
    for backbone, style in (("delta", "-o"), ("kafka", "--s")):
        rows = sorted((r for r in runs if r.backbone == backbone), key=lambda r: r.rate)
        if not rows:
            continue
        for key, color in colors.items():
            values = [(r.rate, r.percentile(key)) for r in rows]
            pts = [(rate, max(v, 1e-3)) for rate, v in values if v is not None]
            if not pts:
                continue
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                style,
                color=color,
                label=f"{backbone} {key}",
                markersize=4,
            )
    anchors = ANCHORS.get(profile_key(profile), {})
    if anchors:
        ar = sorted(anchors)
        ax.plot(ar, [anchors[r][0] for r in ar], "x", color="tab:blue", label="anchor p50")
        ax.plot(ar, [anchors[r][1] for r in ar], "x", color="tab:red", label="anchor p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted({r.rate for r in runs} | set(anchors))
    ax.set_xticks(ticks, [f"{t / 1000:g}k" if t >= 1000 else str(t) for t in ticks])
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("rate (msg/s)")
    ax.set_ylabel("latency (s)")
    ax.set_title(f"latency percentiles vs rate (commit {profile})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def soak_windows_plot(path: Path, report: dict) -> Path:
    """A windowed soak per window: p50/p99 (s), resident memory per process (MB) and the
    objects under the run's prefix; the x axis is minutes after the warm-up."""
    from matplotlib.figure import Figure

    windows = report["windows"]
    t0 = windows[0]["start_s"]
    x = [(w["end_s"] - t0) / 60 for w in windows]
    fig = Figure(figsize=(9, 9), dpi=100)
    lat, mem, obj = fig.subplots(3, 1, sharex=True)
    for key, style in (("p50_s", "-o"), ("p99_s", "--s")):
        lat.plot(x, [w[key] for w in windows], style, markersize=4, label=key.removesuffix("_s"))
    lat.set_ylabel("latency (s)")
    lat.set_ylim(bottom=0)
    lat.set_title(
        f"soak at {report['rate']:,} msg/s, commit {report['profile']}, store "
        f"{report['store']['profile']}: per {report['window_minutes']:g}-min window"
    )
    names: list[str] = []
    for w in windows:
        names += [n for n in w["rss_mb"] if n not in names]
    for name in names:
        mem.plot(x, [w["rss_mb"].get(name) for w in windows], "-o", markersize=3, label=name)
    mem.set_ylabel("resident memory (MB)")
    mem.set_ylim(bottom=0)
    counts = [None if w["objects"] is None else w["objects"]["objects"] for w in windows]
    obj.plot(x, counts, "-o", markersize=4, color="tab:green", label="objects")
    obj.set_ylabel("objects under the prefix")
    obj.set_ylim(bottom=0)
    obj.set_xlabel("minutes after the warm-up (window end)")
    for ax in (lat, mem, obj):
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
