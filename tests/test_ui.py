"""The Dagster UI as a person sees it: dagster-webserver on the repo's workspace.yaml, the
asset graph opened in headless Chromium (DOM dump and a screenshot).

Needs Debian's `chromium`: skipped when it is missing, except under CI (CI=true).
The screenshot goes to artifacts/ui/asset-graph.png.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus.local_minio import free_port

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "artifacts" / "ui" / "asset-graph.png"
PIPELINE_ASSETS = (
    "timezone1",
    "timezone2",
    "timezone_unified",
    "results_csv",
    "latency_percentiles",
)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=20000",
    "--window-size=1600,1000",  # the graph renders only the nodes inside the window
]


def chromium() -> str:
    exe = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    if exe is None:
        msg = "chromium is not installed (Debian package: chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def graphql(base: str, query: str) -> dict:
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def webserver(tmp_path: Path) -> Iterator[str]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    log = (tmp_path / "webserver.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster_webserver",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-w",
            "workspace.yaml",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "webserver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the webserver did not load the code location"
            try:
                nodes = graphql(base, "{ assetNodes { assetKey { path } } }")["data"]["assetNodes"]
                if any(n["assetKey"]["path"] == ["timezone_unified"] for n in nodes):
                    break
            except (OSError, KeyError, TypeError, ValueError):
                pass
            time.sleep(0.5)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def browse(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_asset_graph_shows_the_pipeline(webserver: str, tmp_path: Path):
    exe = chromium()
    page = f"{webserver}/locations/deltabus/asset-groups/pipeline"
    dom = browse(exe, tmp_path / "profile-dom", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for asset in PIPELINE_ASSETS:
        assert asset in dom.stdout, f"{asset} is not on the asset graph page"
    assert "Asset checks" in dom.stdout

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    shot = browse(exe, tmp_path / "profile-shot", f"--screenshot={SCREENSHOT}", page)
    assert shot.returncode == 0, shot.stderr[-2000:]
    data = SCREENSHOT.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a rendered page, not blank

    jobs = graphql(
        webserver,
        '{ repositoryOrError(repositorySelector: {repositoryLocationName: "deltabus", '
        'repositoryName: "__repository__"}) { ... on Repository { jobs { name } '
        "sensors { name } schedules { name } } } }",
    )["data"]["repositoryOrError"]
    assert {"pipeline_job", "etl_service_start_job"} <= {j["name"] for j in jobs["jobs"]}
    assert {s["name"] for s in jobs["sensors"]} == {"unified_commits_sensor", "etl_service_sensor"}
