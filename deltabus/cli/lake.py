"""`deltabus init-bucket` and `deltabus check`: the lake itself."""

from __future__ import annotations

from deltabus.cli.root import app
from deltabus.cli.state import lake


@app.command("init-bucket")
def init_bucket() -> None:
    """Create the configured bucket on MinIO (no-op when it exists)."""
    lk = lake(check=False)
    created = lk.init_bucket()
    lk.check(write=True)
    s = lk.settings
    print(f"bucket '{s.bucket}' {'created' if created else 'exists'} at {s.describe()}")


@app.command("check")
def check() -> None:
    """Check that the lake is reachable and writable with the configured settings."""
    lk = lake(write=True)
    print(f"ok: {lk.settings.describe()}")
