"""Live progress on stderr: rate, producer lag, end-to-end lag and running p99.

A terminal gets a `rich` live panel; anything else (CI, pipes) gets one log line every
few seconds, so logs stay readable.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("deltabus_bench")


def _s(x: float | None, nd: int = 3) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


class ProgressDisplay:
    def __init__(self, enabled: bool = True, every_s: float = 5.0) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.live = None
        self.every_s = every_s
        self._last_log = 0.0
        self.enabled = enabled and self.console.is_terminal

    def __enter__(self) -> ProgressDisplay:
        if self.enabled:
            from rich.live import Live

            self.live = Live(console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def update(self, s: dict) -> None:
        """s: backbone, rate, phase, elapsed, duration, produced, total, producer_lag_s,
        seen, window_p50, window_p99, running_p99, e2e_lag_s, achieved_rate."""
        if self.live is not None:
            from rich.table import Table

            table = Table(
                title=f"deltabus bench: {s['backbone']} at {s['rate']:,} msg/s",
                show_header=False,
                expand=False,
            )
            table.add_column(style="bold")
            table.add_column()
            table.add_row("phase", f"{s['phase']}  {s['elapsed']:.0f}/{s['duration']:.0f} s")
            table.add_row(
                "produced", f"{s['produced']:,}/{s['total']:,}  ({s['achieved_rate']:,.0f} msg/s)"
            )
            table.add_row("producer lag", f"{_s(s['producer_lag_s'])} s behind schedule")
            table.add_row("seen by consumer", f"{s['seen']:,}")
            table.add_row("end-to-end lag", f"{_s(s['e2e_lag_s'])} s (now - newest seen sent)")
            table.add_row(
                "latency last 5 s", f"p50 {_s(s['window_p50'])} s  p99 {_s(s['window_p99'])} s"
            )
            table.add_row("running p99", f"{_s(s['running_p99'])} s (after warm-up)")
            self.live.update(table)
            return
        now = time.monotonic()
        if now - self._last_log >= self.every_s:
            self._last_log = now
            log.info(
                "%s %s msg/s %s %.0f/%.0fs: produced %d/%d (%.0f msg/s, lag %s s), seen %d, "
                "p99 last 5 s %s s, running p99 %s s",
                s["backbone"],
                f"{s['rate']:,}",
                s["phase"],
                s["elapsed"],
                s["duration"],
                s["produced"],
                s["total"],
                s["achieved_rate"],
                _s(s["producer_lag_s"]),
                s["seen"],
                _s(s["window_p99"]),
                _s(s["running_p99"]),
            )
