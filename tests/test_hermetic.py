"""The suite ignores the user's settings: serving and Dagster tests pass in a pytest run
whose working directory holds a `.env`, and whose environment holds lake, PostgreSQL and
Dagster variables, all pointing at closed loopback ports or at an unusable instance.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from deltabus.adapters.dev.minio_process import MinioServer
from deltabus.apps.timezones.service import SERVICE_DIR_VAR
from deltabus.core.net import free_port
from deltabus.core.settings import ENV_FILE_VAR, Settings, load_settings
from tests.conftest import IN_CI, SESSION_DIR, user_setting

TESTS = Path(__file__).resolve().parent
# Set in the inner run, so this test never runs inside itself.
INNER_VAR = "DELTABUS_TEST_HERMETIC_INNER"
# Tests of the inner run (file, -k expression and the ids that must pass): PostgreSQL from
# the fixture in process and in child processes, the lake from fixtures, Dagster resources
# that read the process's settings.
INNER = {
    "test_hermetic.py": ("test_this_process_holds_no_user_setting",),
    "test_serve_postgres.py": (
        "test_retractions_and_updates_reach_the_served_table",
        "test_no_postgres_configured_names_the_fix",
        "test_unusable_postgres_is_one_clear_error and bad",
    ),
    "test_dagster_serving.py": (
        "test_asset_serves_and_checks_tell_when_it_is_behind",
        "test_resource_takes_the_dsn_from_the_environment",
    ),
}
EXPECTED = {
    "test_this_process_holds_no_user_setting",
    "test_retractions_and_updates_reach_the_served_table[minio]",
    "test_retractions_and_updates_reach_the_served_table[local]",
    "test_no_postgres_configured_names_the_fix",
    "test_unusable_postgres_is_one_clear_error[bad password]",
    "test_asset_serves_and_checks_tell_when_it_is_behind",
    "test_resource_takes_the_dsn_from_the_environment",
}


def user_settings(closed: int) -> dict[str, str]:
    """Settings a developer might have after `make demo`, all pointing nowhere."""
    return {
        "DELTABUS_STORAGE": "minio",
        "DELTABUS_MINIO_ENDPOINT": f"http://127.0.0.1:{closed}",
        "DELTABUS_BUCKET": "users-bucket",
        "DELTABUS_PREFIX": "users-lake",
        "DELTABUS_ACCESS_KEY": "users-access-key",
        "DELTABUS_SECRET_KEY": "users-secret-key",
        "DELTABUS_POSTGRES_DSN": f"postgresql://deltabus:users-pw@127.0.0.1:{closed}/deltabus",
        "MINIO_S3_ACCESS_KEY": "users-access-key",
        "MINIO_S3_SECRET_ACCESS_KEY": "users-secret-key",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}",
        "AWS_ACCESS_KEY_ID": "users-access-key",
        "AWS_SECRET_ACCESS_KEY": "users-secret-key",
    }


def outcomes(report: Path) -> dict[str, str]:
    """Test id -> passed, skipped: <reason>, failed or error, from a JUnit XML report."""
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                reason = element.get("message", "")
                outcome = f"skipped: {reason}" if tag == "skipped" else tag
                break
        found[case.get("name", "")] = outcome
    return found


def test_this_process_holds_no_user_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert os.environ[ENV_FILE_VAR] == os.devnull
    left = [k for k in os.environ if user_setting(k) and k not in (ENV_FILE_VAR, SERVICE_DIR_VAR)]
    assert not left, f"settings of the user's environment reach the tests: {left}"
    for variable in ("DAGSTER_HOME", SERVICE_DIR_VAR):
        assert Path(os.environ[variable]).is_relative_to(SESSION_DIR), variable
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("DELTABUS_BUCKET=from-a-dotenv\n")
    assert load_settings().bucket == Settings.model_fields["bucket"].default


@pytest.mark.skipif(os.environ.get(INNER_VAR) == "1", reason="inside the hermetic run")
def test_user_settings_and_dotenv_reach_no_test(minio: MinioServer, tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there
    settings = user_settings(closed)
    work = tmp_path / "work"
    work.mkdir()
    (work / ".env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    home = tmp_path / "users_dagster_home"  # an instance no test may open
    home.mkdir()
    (home / "dagster.yaml").write_text("storage: [this is not a Dagster instance\n")
    env = {k: v for k, v in os.environ.items() if k != "DELTABUS_ENV_FILE"}
    env.update(settings)
    env.update(
        {
            "DAGSTER_HOME": str(home),
            "DELTABUS_SERVICE_DIR": str(tmp_path / "users_service"),
            "DELTABUS_MINIO_BIN": str(minio.binary),
            "DELTABUS_PYTEST_HARD_EXIT": "1",
            INNER_VAR: "1",
        }
    )
    report = tmp_path / "inner.xml"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    args += ["--basetemp", str(tmp_path / "inner"), "--junitxml", str(report)]
    args += [str(TESTS / name) for name in INNER]
    args += ["-k", " or ".join(f"({k})" for tests in INNER.values() for k in tests)]
    result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    output = (result.stdout + result.stderr)[-6000:]
    assert report.exists(), output
    found = outcomes(report)
    skipped = {k: v for k, v in found.items() if v.startswith("skipped")}
    if skipped and not IN_CI and set(skipped) == set(found):
        pytest.skip(f"the inner run skipped its tests: {sorted(set(skipped.values()))}")
    assert found == dict.fromkeys(EXPECTED, "passed"), output
    assert result.returncode == 0, output
    assert "users-secret-key" not in output and "users-pw" not in output
