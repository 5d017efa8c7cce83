"""The `deltabus` entry point: assembles the command groups and turns user-fixable
problems into one line and exit status 2."""

from __future__ import annotations

import os
import signal
import sys

# lake, records, etl and pipeline register their commands on `app` when imported, in
# this order (the order of the help).
from deltabus.cli import lake  # noqa: F401

# isort: split
from deltabus.cli import records  # noqa: F401

# isort: split
from deltabus.cli import etl  # noqa: F401

# isort: split
from deltabus.cli import pipeline  # noqa: F401

# isort: split
from deltabus.cli.groups import groups_app
from deltabus.cli.minio import minio_app
from deltabus.cli.notify import notify_app
from deltabus.cli.opensearch import opensearch_app
from deltabus.cli.plugins import add_plugin_commands
from deltabus.cli.postgres import postgres_app
from deltabus.cli.root import app
from deltabus.cli.serve import serve_app
from deltabus.cli.state import state
from deltabus.cli.streams import streams_app
from deltabus.core.errors import ConfigError, user_storage_error
from deltabus.core.processes import apply_process_defaults

app.add_typer(minio_app, name="minio")
app.add_typer(streams_app, name="streams")
app.add_typer(groups_app, name="groups")
app.add_typer(notify_app, name="notify")
app.add_typer(serve_app, name="serve")
app.add_typer(postgres_app, name="postgres")
app.add_typer(opensearch_app, name="opensearch")
add_plugin_commands()


_terminated: list[int] = []  # the signal that ended the command, if SIGTERM did


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM raises KeyboardInterrupt where the main thread is, so that cleanups run
    as on Ctrl-C (the command line may wrap it on its way up: the signal is noted)."""
    _terminated.append(signum)
    raise KeyboardInterrupt


def main() -> None:
    """Entry point: user-fixable problems print one clear message and exit with status 2.
    SIGTERM stops a command as Ctrl-C does (its child processes are stopped too), unless
    the command stops gracefully on it by itself."""
    apply_process_defaults()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except SystemExit as exc:
        if _terminated and exc.code == 130:  # the command line's own answer to Ctrl-C
            print("deltabus: terminated", file=sys.stderr)
            sys.exit(128 + signal.SIGTERM)
        raise
    except KeyboardInterrupt:
        terminated = bool(_terminated)
        print(f"deltabus: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM if terminated else 130)
    except Exception as exc:
        # A storage failure the user must fix (read-only or full lake, access denied) may
        # surface from delta-rs, boto3 or Pathway anywhere in a command: find it in the
        # exception chain. Anything else is a bug, and keeps its traceback.
        s = state.settings
        error = user_storage_error(exc, s.describe() if s else "")
        if error is None:
            raise
        kind = "configuration error" if isinstance(error, ConfigError) else "error"
        text = f"deltabus: {kind}: {error}"
        secrets = [s.secret_key, s.session_token] if s else []
        for secret in (v.get_secret_value() for v in secrets if v is not None):
            text = text.replace(secret, "***")
        print(text, file=sys.stderr)
        # Leave without interpreter teardown: after a failed Pathway run its native
        # threads can crash during it (SIGSEGV), which would hide this exit status.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)


if __name__ == "__main__":
    main()
