"""The Dagster UI as a person sees it after `make demo`: a stream window launched from the
code location (`python -m tools.launch pipeline_job --then producer_run_job`) against the
real MinIO fixture, then `dagster dev` (webserver and daemon) on the repo's workspace.yaml
and that run's DAGSTER_HOME, and pages opened in headless Chromium (DOM dumps and
screenshots): the asset graph, the latency table inline, the runs timeline, freshness.

Needs Debian's `chromium`: skipped when it is missing, except under CI (CI=true).
Screenshots go to artifacts/ui/.
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
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus.core.net import free_port
from deltabus.delta.lake import Lake
from tests.conftest import lake_env, minio_settings_for

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "artifacts" / "ui"
SCREENSHOT = SHOTS / "asset-graph.png"
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
]
WINDOW = "--window-size=1600,1000"  # the graph renders only the nodes inside the window


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


@pytest.fixture(scope="module")
def webserver(minio, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`dagster dev` on a DAGSTER_HOME holding one streaming run launched as `make demo`
    launches it (freshness evaluated every 2 s instead of 30)."""
    tmp = tmp_path_factory.mktemp("ui")
    lake = Lake(minio_settings_for(minio, f"ui-{uuid.uuid4().hex[:10]}"))
    home = tmp / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "platform" / "dagster.yaml").read_text())
    env = {
        **lake_env(lake),
        "DAGSTER_HOME": str(home),
        "DELTABUS_SERVICE_DIR": str(tmp / "service"),
        "PYTHONPATH": str(REPO),
        "FRESHNESS_DAEMON_INTERVAL_SECONDS": "2",
    }
    window = tmp / "window.yaml"
    window.write_text(
        json.dumps(
            {
                "ops": {
                    "stream_window": {"config": {"rate": 1000, "duration_s": 2}},
                    "results_csv": {"config": {"path": str(tmp / "results.csv")}},
                }
            }
        )
    )
    latency = tmp / "latency.yaml"
    latency.write_text(
        json.dumps({"ops": {"latency_percentiles": {"config": {"plot_dir": str(tmp / "plots")}}}})
    )
    demo = subprocess.run(
        [sys.executable, "-m", "tools.launch", "pipeline_job", "-c", str(window)]
        + ["--then", "producer_run_job", "--then-config", str(latency)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stderr[-4000:]

    port = free_port()
    log = (tmp / "dagster-dev.log").open("w")
    # Outside the repository: Dagster's CLI loads ./.env over the environment, and a
    # developer's .env (written by `make demo`) would point the UI's processes elsewhere.
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port)]
        + ["-w", str(REPO / "workspace.yaml")],
        cwd=tmp,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp / "dagster-dev.log").read_text()[-3000:]
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
        os.killpg(proc.pid, signal.SIGTERM)
        try:  # the DAGSTER_HOME is thrown away: no reason to wait out a slow shutdown
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def browse(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, *CHROMIUM_FLAGS, WINDOW, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def shoot(exe: str, profile: Path, page: str, name: str, height: int = 1000) -> Path:
    """A screenshot of `page` at artifacts/ui/NAME.png; fails when it is blank."""
    out = SHOTS / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    shot = browse(exe, profile, f"--window-size=1600,{height}", f"--screenshot={out}", page)
    assert shot.returncode == 0, shot.stderr[-2000:]
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # rendered, not blank
    return out


def test_asset_graph_shows_the_pipeline(webserver: str, tmp_path: Path):
    exe = chromium()
    page = f"{webserver}/locations/deltabus/asset-groups/pipeline"
    dom = browse(exe, tmp_path / "profile-dom", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for asset in PIPELINE_ASSETS:
        assert asset in dom.stdout, f"{asset} is not on the asset graph page"
    assert "Asset checks" in dom.stdout

    shoot(exe, tmp_path / "profile-shot", page, "asset-graph")

    jobs = graphql(
        webserver,
        '{ repositoryOrError(repositorySelector: {repositoryLocationName: "deltabus", '
        'repositoryName: "__repository__"}) { ... on Repository { jobs { name } '
        "sensors { name } schedules { name } } } }",
    )["data"]["repositoryOrError"]
    assert {"pipeline_job", "etl_service_start_job"} <= {j["name"] for j in jobs["jobs"]}
    assert {s["name"] for s in jobs["sensors"]} == {
        "unified_commits_sensor",
        "etl_service_sensor",
        "streams_sensor",
    }


def test_latency_table_is_inline_on_the_asset_page(webserver: str, tmp_path: Path):
    exe = chromium()
    page = f"{webserver}/assets/latency_percentiles"
    dom = browse(exe, tmp_path / "profile-dom", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The percentiles table is rendered as a table on the overview, no click needed.
    for text in ("end to end (sent to unified commit)", "p99_s", "events", "streaming"):
        assert text in dom.stdout, f"{text!r} is not on the latency_percentiles page"
    shoot(exe, tmp_path / "profile-shot", page, "latency-table", height=1500)


def test_the_streaming_run_is_on_the_runs_timeline(webserver: str, tmp_path: Path):
    exe = chromium()
    page = f"{webserver}/overview/activity/timeline"
    dom = browse(exe, tmp_path / "profile-dom", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # Launched from the code location, both runs of the demo are on the timeline.
    assert "pipeline_job" in dom.stdout and "producer_run_job" in dom.stdout
    shoot(exe, tmp_path / "profile-shot", page, "runs-timeline")


def test_timezone_unified_is_fresh(webserver: str, tmp_path: Path):
    query = (
        '{ assetNodes(assetKeys: [{path: ["timezone_unified"]}]) '
        "{ freshnessStatusInfo { freshnessStatus } } }"
    )
    deadline = time.monotonic() + 90
    status = None
    while time.monotonic() < deadline:
        node = graphql(webserver, query)["data"]["assetNodes"][0]
        status = (node.get("freshnessStatusInfo") or {}).get("freshnessStatus")
        if status == "HEALTHY":
            break
        time.sleep(1)
    assert status == "HEALTHY", f"freshness of timezone_unified: {status}"
    exe = chromium()
    page = f"{webserver}/assets/timezone_unified"
    dom = browse(exe, tmp_path / "profile-dom", "--dump-dom", page)
    assert "Freshness" in dom.stdout and "Passing" in dom.stdout
    shoot(exe, tmp_path / "profile-shot", page, "timezone-unified", height=1500)
    shoot(exe, tmp_path / "profile-checks", f"{page}?view=checks", "checks")
