"""Shared fixtures: a real MinIO on a free loopback port, and lakes on MinIO or local disk.

The suite never reads the user's settings: at import, every variable `Settings` reads
(DELTABUS_*, MINIO_S3_* and the other names of its fields), AWS_* variables and the
service directory are removed from this process's environment, DELTABUS_ENV_FILE names
an empty file (so no `./.env` is read, here or in a child inheriting this environment),
and DAGSTER_HOME is a directory of this session. Each test and each child process it
starts gets its settings from its fixtures alone. Variables that steer the tests
themselves stay, e.g. DELTABUS_TEST_POSTGRES_DSN (an existing PostgreSQL, tests/pg_fixture.py),
DELTABUS_TEST_OPENSEARCH_URL (an existing OpenSearch, tests/opensearch_fixture.py),
DELTABUS_RETRY_MAX_WAIT_S, DELTABUS_MINIO_BIN, DELTABUS_CACHE, DELTABUS_CHAOS_*,
DELTABUS_SPARK_REQUIRED, DELTABUS_PYTEST_HARD_EXIT, CI.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import AliasChoices

from deltabus.adapters.dev.minio_process import MinioServer, build_minio, find_minio
from deltabus.apps.timezones.service import SERVICE_DIR_VAR
from deltabus.core.processes import LAKE_ENV_PREFIXES, apply_process_defaults, child_env
from deltabus.core.settings import ENV_FILE_VAR, Settings
from deltabus.delta.lake import Lake

IN_CI = os.environ.get("CI", "").lower() == "true"
TEST_BUCKET = "deltabus-test"
pytest_plugins = ["tests.pg_fixture", "tests.store_fixture", "tests.opensearch_fixture"]
# Settings variables the tests read as their own controls, not as the lake's settings.
# Set by the tests themselves: the AWS chain reads no file and no metadata service of the
# user's.
AWS_ISOLATION = frozenset(
    {"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_EC2_METADATA_DISABLED"}
)
TEST_CONTROLS = frozenset({"DELTABUS_RETRY_MAX_WAIT_S", *AWS_ISOLATION})


def settings_variables() -> frozenset[str]:
    """The names (upper case) of every environment variable `Settings` reads.

    pydantic-settings matches names case-insensitively, so callers compare upper case.
    """
    prefix = str(Settings.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{field}".upper())
    return frozenset(names)


def user_setting(name: str) -> bool:
    """True for a variable that configures a lake, a store or a service state directory."""
    upper = name.upper()
    if upper in TEST_CONTROLS:
        return False
    return (
        upper in settings_variables()
        or upper.startswith(("MINIO_S3_", "AWS_"))
        or upper in (ENV_FILE_VAR, SERVICE_DIR_VAR)
    )


def _isolate_environment() -> Path:
    """Drop the user's settings from os.environ; returns this session's directory."""
    for name in [k for k in os.environ if user_setting(k)]:
        del os.environ[name]
    session = Path(tempfile.mkdtemp(prefix="deltabus-tests-"))
    home = session / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ[SERVICE_DIR_VAR] = str(session / "service")
    os.environ[ENV_FILE_VAR] = os.devnull
    # The AWS credential chain reads nothing of the user's: no ~/.aws files, no instance
    # metadata.
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(session / "no-aws-credentials")
    os.environ["AWS_CONFIG_FILE"] = str(session / "no-aws-config")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    return session


SESSION_DIR = _isolate_environment()
apply_process_defaults()
os.environ.setdefault("DELTABUS_RETRY_MAX_WAIT_S", "60")


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A real MinIO server for the whole session. In CI a missing MinIO is a failure."""
    binary = find_minio()
    if binary is None:
        if shutil.which("go"):
            binary = build_minio()
        elif IN_CI:
            pytest.fail("MinIO is required in CI: run `make minio-bin` (go install) first")
        else:
            pytest.skip("no MinIO binary and no Go to build one (set DELTABUS_MINIO_BIN)")
    server = MinioServer(
        tmp_path_factory.mktemp("minio") / "data",
        access_key="test-" + secrets.token_hex(4),
        secret_key=secrets.token_urlsafe(18),
        binary=binary,
        public_metrics=True,  # the benchmark reads request counts from MinIO's metrics
    )
    server.start()
    Lake(minio_settings_for(server, "bootstrap")).init_bucket()
    yield server
    server.stop()


def minio_settings_for(server: MinioServer, prefix: str, **extra: object) -> Settings:
    """Settings for `server` under `prefix`; `extra` adds or overrides (the bucket too)."""
    fields: dict[str, object] = {
        "storage": "minio",
        "minio_endpoint": server.endpoint,
        "access_key": server.access_key,
        "secret_key": server.secret_key,
        "bucket": TEST_BUCKET,
        "prefix": prefix,
    }
    return Settings(**{**fields, **extra})


@pytest.fixture
def minio_lake(minio: MinioServer) -> Lake:
    """A fresh prefix on the session's MinIO."""
    return Lake(minio_settings_for(minio, f"t-{uuid.uuid4().hex[:10]}"))


@pytest.fixture
def local_lake(tmp_path: Path) -> Lake:
    return Lake(Settings(storage="local", local_root=tmp_path / "lake", prefix="lake"))


@pytest.fixture(params=["minio", "local"])
def lake(request: pytest.FixtureRequest) -> Lake:
    """Each test using this runs against MinIO and against a local directory."""
    return request.getfixturevalue(f"{request.param}_lake")


def lake_env(lake: Lake) -> dict[str, str]:
    """Environment variables that point a `deltabus` subprocess at `lake`."""
    return child_env(lake.settings)


def clear_lake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every lake setting and credential from this process's environment.

    DELTABUS_ENV_FILE stays an empty file: `load_settings()` reads no `./.env`.
    """
    for key in list(os.environ):
        if key.startswith(LAKE_ENV_PREFIXES) or user_setting(key):
            monkeypatch.delenv(key)
    monkeypatch.setenv(ENV_FILE_VAR, os.devnull)


def use_lake_env(monkeypatch: pytest.MonkeyPatch, lake: Lake) -> None:
    """Point this process's environment (which the Dagster resources read) at `lake`."""
    clear_lake_env(monkeypatch)
    for key, value in lake_env(lake).items():
        if key.startswith("DELTABUS_"):
            monkeypatch.setenv(key, value)


def run_cli(
    args: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout: float = 300,
    input: str | None = None,  # noqa: A002 - subprocess.run's name
) -> subprocess.CompletedProcess[str]:
    """Run `deltabus ARGS` as a real subprocess, with `input` on its stdin. A command that
    outlives `timeout` fails the test with the end of its log."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "deltabus", *args],
            input=input,
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or b""
        log = err if isinstance(err, str) else err.decode(errors="replace")
        command = " ".join(args)
        pytest.fail(f"deltabus {command} ran past {timeout:g} s; its log ends:\n{log[-6000:]}")


MARKERS = {
    "integration": "talks to a real server (MinIO, PostgreSQL, OpenSearch, Kafka, Spark) that"
    " the test or a fixture starts on loopback; set by the server fixtures it uses",
    "spark": "needs Delta Spark (pyspark, delta-spark, the Delta/s3a jars); `make spark` runs"
    " these, `make test` leaves them out",
    "slow": "runs for minutes (soaks, chaos, link cuts, wheel builds); `-m 'not slow'` for a"
    " quick pass",
    "multihost": "runs in network namespaces as root; `make multihost` runs it, `make test`"
    " leaves it out",
}
# A test that uses one of these fixtures (directly or through another) is `integration`.
SERVER_FIXTURES = frozenset(
    {"minio", "opensearch", "own_opensearch", "postgres", "own_postgres", "toxiproxy", "spark"}
)


def kafka_ready() -> bool:
    """True when Java and Kafka's cached jars are here (`platform/kafka.sh fetch`)."""
    from deltabus_bench.kafka.broker import kafka_script

    if shutil.which("java") is None:
        return False
    libs = subprocess.run(["bash", str(kafka_script()), "libs"], capture_output=True, text=True)
    return libs.returncode == 0


def require_kafka() -> None:
    """Fail with CI=true, else skip, when Kafka cannot run here."""
    if not kafka_ready():
        why = "Kafka needs Java 17 and `platform/kafka.sh fetch` (make test runs it)"
        if IN_CI:
            pytest.fail(f"this Kafka test must run here: {why}")
        pytest.skip(why)


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


# The files that run longest, longest first. `make test` hands whole files to its workers
# in collection order (`--dist loadfile --no-loadscope-reorder`), so a long file started
# last cannot keep one worker busy while the other waits.
LONGEST_FIRST = (
    "test_bench_smoke.py",
    "test_launch.py",
    "test_etl_lease.py",
    "test_bench_serve.py",
    "test_ui.py",
    "test_dagster_cli.py",
    "test_serve_opensearch.py",
    "test_exactly_once_under_faults.py",
    "test_bench_soak_windows.py",
    "test_foreign_writers.py",
    "test_serve_postgres.py",
    "test_live_maintenance.py",
    "test_admin.py",
    "test_chaos_soak.py",
    "test_dagster_pipeline.py",
    "test_dagster_sensors.py",
    "test_streams.py",
    "test_install.py",
    "test_retention.py",
    "test_transform_lease.py",
    "test_serve_lease.py",
)


def _run_order(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # stable: a file's tests keep their order and stay together
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_minio = callspec is not None and callspec.params.get("lake") == "minio"
        if on_minio or SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process once pytest has reported, with its status.

    DuckDB's and arro3's bindings print pages of "leaked instance" notices during
    interpreter shutdown; skipping that shutdown keeps pytest's summary the last line.
    """
    if _exit_status and os.environ.get("DELTABUS_PYTEST_HARD_EXIT", "1") == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[0])
