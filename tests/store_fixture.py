"""toxiproxy for the store-profile tests: `$DELTABUS_TOXIPROXY_BIN`, the cached pinned
build, or a build with `go install` (deltabus_bench.store_profiles). In CI a missing
toxiproxy is a failure, never a skip."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from deltabus_bench.store_profiles import (
    TOXIPROXY_BIN_VAR,
    build_toxiproxy,
    find_toxiproxy,
)

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def toxiproxy() -> Path:
    """The pinned toxiproxy server binary, built once if Go is there."""
    binary = find_toxiproxy()
    if binary is not None:
        return binary
    if shutil.which("go"):
        return build_toxiproxy()
    message = f"no toxiproxy binary and no Go to build one (set {TOXIPROXY_BIN_VAR})"
    if IN_CI:
        pytest.fail(f"toxiproxy is required in CI: {message}; run `make toxiproxy-bin`")
    pytest.skip(message)
