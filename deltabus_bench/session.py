"""Where a benchmark command runs: its MinIO (a throwaway one or the configured one),
the store profile's proxy, the notify relay, and the runs themselves; and the
alternating comparison of layouts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from deltabus.core.settings import Settings
    from deltabus_bench.config import BenchConfig


def compare_layouts(
    config, text: str, rounds: int, *, local_minio: bool | None, progress: bool
) -> None:
    """--layouts: the alternating comparison (bench.layouts), printed as a table."""
    from deltabus.cli import state as cli
    from deltabus.core.errors import ConfigError
    from deltabus_bench.layouts import compare, parse_layouts

    layouts = parse_layouts(text)
    if (config.partitions, config.etl_processes) != (1, 1):
        raise ConfigError("give either --layouts or --partitions/--etl-processes, not both")
    scenario = [
        name
        for name, on in (
            ("--backbone kafka", "kafka" in config.backbones),
            ("--backlog-drain", config.backlog_drain > 0),
            ("--soak", config.soak),
            ("--soak-minutes", config.windowed),
            ("--serve", config.serve is not None),
        )
        if on
    ]
    if scenario:
        raise ConfigError(
            f"--layouts compares the steady cost of Delta layouts; {', '.join(scenario)} "
            "is not part of that",
            "run the scenario with --partitions P --etl-processes N instead",
        )
    settings = cli.settings()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    summary = compare(
        config,
        layouts,
        rounds,
        lambda cfg: run(cfg, settings, local_minio=local_minio, show_progress=progress),
        log=log,
    )
    errors = summary.pop("errors")
    if cli.state.as_json:
        print(__import__("json").dumps(summary))
    else:
        print((config.out / "layouts.md").read_text().rstrip())
        print(f"\nsummary: {config.out / 'layouts.md'}  (layouts.json; each run in {config.out})")
    if errors:
        for e in errors:
            print(f"deltabus bench: error: {e}", file=sys.stderr)
        raise typer.Exit(1)


def notify_for(config: BenchConfig, local_minio: bool) -> bool:
    """Whether the run's tails wait on pushed commit events: `--notify/--no-notify`, else
    on where the store offers them as a deployed MinIO would, a throwaway MinIO on
    loopback (ADR 0032); off behind a store profile, which stands for S3, where commit
    events come late or not at all."""
    if config.notify is not None:
        return config.notify
    return local_minio and config.store == "loopback"


def run(config, settings, *, local_minio: bool | None = None, show_progress: bool = True) -> dict:
    """Run the benchmark on `settings` (or a throwaway MinIO); returns report.json + errors."""

    from deltabus.adapters.serving.settings import load_serving_settings
    from deltabus.cli import state as cli
    from deltabus.core.errors import ConfigError
    from deltabus.delta.lake import Lake
    from deltabus_bench.environment import minio_configured, throwaway_minio
    from deltabus_bench.runner import Bench

    serving = load_serving_settings(cli.state.env_file)
    if local_minio is None:
        local_minio = not minio_configured(settings) and settings.storage == "minio"
    if local_minio:
        with throwaway_minio(notify=notify_for(config, local_minio)) as (minio_settings, pids):
            with _store_proxy(config, minio_settings) as (proxied, proxy_pids):
                return Bench(
                    config,
                    proxied,
                    minio_pid=pids["minio"],
                    relay_pid=pids.get("relay"),
                    show_progress=show_progress,
                    metrics_endpoint=minio_settings.minio_endpoint,
                    proxy_pids=proxy_pids,
                    serving=serving,
                ).run()
    if config.notify:
        raise ConfigError(
            "--notify starts its own MinIO and relay: add --local-minio",
            "for your own MinIO, run `deltabus notify relay`, point MinIO's webhook target at it "
            "and set DELTABUS_NOTIFY=true and DELTABUS_NOTIFY_URL (docs/design/tailing.md)",
        )
    Lake(settings).check(write=True)
    with _store_proxy(config, settings) as (proxied, proxy_pids):
        return Bench(
            config,
            proxied,
            minio_pid=_minio_pid(settings),
            show_progress=show_progress,
            metrics_endpoint=settings.minio_endpoint,
            proxy_pids=proxy_pids,
            serving=serving,
        ).run()


@contextmanager
def _store_proxy(
    config: BenchConfig, settings: Settings
) -> Iterator[tuple[Settings, dict[str, int]]]:
    """(`settings` with MinIO reached through the store profile's proxy, the proxies' pids
    by name) while it runs (the loopback profile: `settings` unchanged, nothing started)."""
    from deltabus.core.errors import ConfigError
    from deltabus_bench.store_profiles import StoreProxy, profile

    chosen = profile(config.store)
    if not chosen.proxied:
        yield settings, {}
        return
    if settings.storage != "minio":
        raise ConfigError(
            f"--store {chosen.name} goes in front of MinIO; this lake is a local directory",
            "use --local-minio or a MinIO lake",
        )
    with StoreProxy(chosen, settings.minio_endpoint, config.out / "logs") as proxy:
        yield settings.model_copy(update={"minio_endpoint": proxy.endpoint}), proxy.pids


def _minio_pid(settings) -> int | None:
    """The pid of a MinIO on this machine serving the endpoint's port (for CPU figures)."""
    import re

    m = re.match(r"https?://(127\.0\.0\.1|localhost)(?::(\d+))?", settings.minio_endpoint)
    if settings.storage != "minio" or not m:
        return None
    import psutil

    port = m.group(2) or "80"
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].endswith("minio") and any(c.endswith(f":{port}") for c in cmd):
            return int(proc.info["pid"])
    return None
