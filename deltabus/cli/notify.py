"""`deltabus notify relay|subscribe`: commit notifications pushed by MinIO."""

from __future__ import annotations

import os
import signal
from typing import Annotated

import typer

from deltabus.cli.state import lake
from deltabus.core.errors import ConfigError

notify_app = typer.Typer(
    help="Commit notifications: MinIO pushes each commit to a relay, tails wait on it "
    "instead of polling (DELTABUS_NOTIFY=true, DELTABUS_NOTIFY_URL=http://<relay>/events).",
    no_args_is_help=True,
)


@notify_app.command("relay")
def notify_relay(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 9100,
    token_env: Annotated[
        str | None,
        typer.Option(
            help="Name of an environment variable holding the bearer token MinIO sends "
            "(MINIO_NOTIFY_WEBHOOK_AUTH_TOKEN_DELTABUS); unset: no token required."
        ),
    ] = None,
) -> None:
    """Run the relay: MinIO's webhook target POSTs events to /minio, tailing processes
    stream them from /events. Runs until interrupted."""

    from deltabus.bus.notify_relay import NotifyRelay

    token = os.environ.get(token_env) if token_env else None
    if token_env and not token:
        raise ConfigError(f"--token-env {token_env}: that variable is not set")
    try:
        relay = NotifyRelay(host, port, token)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}", "choose --port"
        ) from None

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # Set explicitly, and before the line that says the relay runs: a process started
    # with SIGTERM ignored would otherwise never stop.
    signal.signal(signal.SIGTERM, interrupt)
    try:  # a SIGTERM right after the line is printed stops the relay cleanly too
        print(
            f"relay on {relay.url}: MinIO posts to {relay.url}/minio, "
            f"tails read {relay.url}/events",
            flush=True,
        )
        relay.serve_forever()
    except KeyboardInterrupt:
        pass


@notify_app.command("subscribe")
def notify_subscribe() -> None:
    """Send the lake's commit events (.json objects created under the prefix) to the
    relay: sets the bucket's notification configuration to MinIO's DELTABUS webhook target."""
    from deltabus.bus.notify_relay import subscribe

    lk = lake()
    arn = subscribe(lk)
    print(f"commit events of bucket {lk.settings.bucket} go to {arn}")
