"""Bucket, credential and endpoint errors: one clear message, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltabus.errors import ConfigError
from deltabus.lake import Lake
from deltabus.local_minio import MinioServer, free_port
from deltabus.producer import ProducerConfig
from deltabus.settings import load_settings
from tests.conftest import lake_env, run_cli

COMMANDS = [
    ["produce", "--count", "10"],
    ["etl"],
    ["results", "--out", "r.csv"],
    ["check"],
]


def objects_under(minio: MinioServer, lake: Lake) -> list[str]:
    client = lake.s3_client()
    bucket = lake.settings.bucket
    names = [b["Name"] for b in client.list_buckets()["Buckets"]]
    if bucket not in names:
        return []
    listing = client.list_objects_v2(Bucket=bucket, Prefix=lake.settings.prefix)
    return [o["Key"] for o in listing.get("Contents", [])]


def assert_clean_failure(result, *fragments: str, secret: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert secret not in result.stdout + result.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_missing_bucket(minio: MinioServer, minio_lake: Lake, tmp_path: Path, command) -> None:
    env = lake_env(minio_lake) | {"DELTABUS_BUCKET": "no-such-bucket"}
    result = run_cli(command, env, tmp_path)
    assert_clean_failure(
        result,
        "bucket 'no-such-bucket' does not exist",
        "deltabus init-bucket",
        secret=env["DELTABUS_SECRET_KEY"],
    )
    ghost = Lake(minio_lake.settings.model_copy(update={"bucket": "no-such-bucket"}))
    assert objects_under(minio, ghost) == []
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_wrong_credentials(minio: MinioServer, minio_lake: Lake, tmp_path: Path, command) -> None:
    wrong = "not-the-secret-" + "x" * 12
    env = lake_env(minio_lake) | {"DELTABUS_SECRET_KEY": wrong}
    result = run_cli(command, env, tmp_path)
    assert_clean_failure(result, "rejected the credentials", "DELTABUS_SECRET_KEY", secret=wrong)
    assert objects_under(minio, minio_lake) == []


def test_unreachable_endpoint(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake) | {"DELTABUS_MINIO_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    result = run_cli(["produce", "--count", "10"], env, tmp_path)
    assert_clean_failure(
        result,
        "cannot reach MinIO at http://127.0.0.1:",
        "make minio",
        secret=env["DELTABUS_SECRET_KEY"],
    )


def test_init_bucket_creates_the_bucket(
    minio: MinioServer, minio_lake: Lake, tmp_path: Path
) -> None:
    env = lake_env(minio_lake) | {"DELTABUS_BUCKET": "fresh-bucket"}
    assert run_cli(["check"], env, tmp_path).returncode == 2
    created = run_cli(["init-bucket"], env, tmp_path)
    assert created.returncode == 0, created.stderr
    assert "bucket 'fresh-bucket' created" in created.stdout
    again = run_cli(["init-bucket"], env, tmp_path)
    assert "bucket 'fresh-bucket' exists" in again.stdout
    assert run_cli(["check"], env, tmp_path).returncode == 0


def test_missing_secret_is_named(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    env.pop("DELTABUS_SECRET_KEY")
    result = run_cli(["check"], env, tmp_path)
    assert result.returncode == 2
    assert "no MinIO secret key is configured" in result.stderr


def test_example_env_names_are_accepted(
    minio: MinioServer, minio_lake: Lake, tmp_path: Path
) -> None:
    """A `.env` with the published example's MINIO_S3_* names works as is."""
    env = lake_env(minio_lake)
    access, secret = env.pop("DELTABUS_ACCESS_KEY"), env.pop("DELTABUS_SECRET_KEY")
    env.pop("DELTABUS_ENV_FILE", None)  # read ./.env, as a user would
    (tmp_path / ".env").write_text(
        f"MINIO_S3_ACCESS_KEY={access}\nMINIO_S3_SECRET_ACCESS_KEY={secret}\n"
    )
    result = run_cli(["check"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert secret not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": -5, "count": 10}, "rate must be a positive number"),
        ({"rate": 10}, "exactly one of duration and count"),
        ({"rate": 10, "count": 5, "commit_interval": 0}, "commit interval"),
    ],
)
def test_invalid_producer_options(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        ProducerConfig(**kwargs)


def test_invalid_option_on_the_command_line(local_lake: Lake, tmp_path: Path) -> None:
    result = run_cli(["produce", "--rate", "-1", "--count", "5"], lake_env(local_lake), tmp_path)
    assert result.returncode == 2
    assert "rate must be a positive number" in result.stderr
    assert not Path(local_lake.root).exists()


def test_unreadable_env_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read settings file"):
        load_settings(tmp_path / "missing.env")


@pytest.mark.parametrize("command", [["results", "--out", "r.csv"], ["etl"]], ids=lambda c: c[0])
def test_lake_root_that_is_not_a_delta_table(local_lake: Lake, tmp_path: Path, command) -> None:
    junk = Path(local_lake.uri("timezone_unified"))
    junk.mkdir(parents=True)
    (junk / "part-0.csv").write_text("not,delta\n")
    result = run_cli(command, lake_env(local_lake), tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "holds files but is not a Delta table" in result.stderr
    assert sorted(p.name for p in junk.iterdir()) == ["part-0.csv"]  # nothing written


@pytest.mark.parametrize(
    ("args", "env_extra", "message"),
    [
        (["etl", "--commit-interval-ms", "0"], {}, "commit interval must be"),
        (["--env-file", "missing.env", "check"], {}, "cannot read settings file missing.env"),
        (["check"], {"DELTABUS_STORAGE": "s4"}, "invalid settings: storage"),
        (["check"], {"DELTABUS_BUCKET": "Bad_Bucket"}, "invalid settings: bucket"),
        (["check"], {"DELTABUS_MINIO_ENDPOINT": "127.0.0.1:9000"}, "must start with http"),
    ],
)
def test_invalid_configuration_stops_cleanly(
    local_lake: Lake, tmp_path: Path, args, env_extra, message
) -> None:
    result = run_cli(args, lake_env(local_lake) | env_extra, tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not Path(local_lake.root).exists()


def test_secret_never_appears_in_output(minio_lake: Lake, tmp_path: Path) -> None:
    env = lake_env(minio_lake)
    secret = env["DELTABUS_SECRET_KEY"]
    outputs = []
    for args in (
        ["-v", "produce", "--count", "300", "--rate", "1000"],
        ["-v", "--json", "etl"],
        ["-v", "results", "--out", "r.csv"],
        ["-v", "check"],
    ):
        result = run_cli(args, env, tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.append(result.stdout + result.stderr)
    text = "\n".join(outputs)
    assert "DEBUG" in text  # verbose logging was really on
    assert secret not in text
    assert secret not in repr(minio_lake.settings) and secret not in str(minio_lake.settings)
    assert secret not in (tmp_path / "r.csv").read_text()


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("Generic S3 error: error sending request for url (http://127.0.0.1:1/x)", True),
        (
            "When reading information for key 'k': AWS Error NETWORK_CONNECTION during "
            "HeadObject operation: curlCode: 7, Could not connect to server",
            True,
        ),
        (
            "When reading information for key 'k': AWS Error UNKNOWN (HTTP status 499) during "
            "HeadObject operation: No response body.",
            True,
        ),
        ("Service Unavailable (503): XMinioServerNotInitialized", True),
        ("AWS Error ACCESS_DENIED during GetObject operation: Access Denied", False),
        ("S3 error: SignatureDoesNotMatch", False),
        ("Schema error: Cannot cast schema, number of fields does not match", False),
    ],
)
def test_transient_errors_are_told_from_permanent_ones(message: str, transient: bool) -> None:
    from deltabus.retry import is_transient

    assert is_transient(OSError(message)) is transient


def test_a_stop_cuts_an_outage_retry_short_but_rides_out_a_blip():
    """retry_storage under `stop_waiting_on`: once the stop is set it tries a few more
    seconds (a blip passes), then raises a clear error instead of waiting out its budget."""
    import threading
    import time

    from deltabus import retry

    stop = threading.Event()
    calls: list[float] = []

    def down() -> None:
        calls.append(time.monotonic())
        raise ConnectionError("connection refused")

    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with retry.stop_waiting_on(stop), pytest.raises(retry.StoppedDuringOutage) as caught:
        retry.retry_storage(down, what="poll timezone1", max_wait=120)
    took = time.monotonic() - started
    assert took < retry.STOP_GRACE_S + 2, took
    assert "poll timezone1" in str(caught.value) and "nothing is lost" in str(caught.value)
    assert len(calls) >= 4  # it kept trying during the grace, about once a second

    # A blip right at the stop: the call still succeeds.
    stop.clear()
    stop.set()
    attempts = iter([ConnectionError("connection reset"), ConnectionError("503"), None])

    def blip() -> str:
        if (exc := next(attempts)) is not None:
            raise exc
        return "committed"

    with retry.stop_waiting_on(stop):
        assert retry.retry_storage(blip, what="commit", max_wait=120) == "committed"
    # Outside the context, a set event no longer shortens anything.
    assert not retry._stop_requested()


@pytest.mark.parametrize(
    ("error", "problem", "fix"),
    [
        (
            OSError(28, "No space left on device"),
            "no space left on the lake storage",
            "DELTABUS_LOCAL_ROOT",
        ),
        (
            OSError(
                "Generic S3 error: Error performing PUT http://127.0.0.1:9000/b/t/part-0.parquet"
                " in 4.3ms - Server returned non-2xx status code: 500 Internal Server Error: "
                "<Error><Message>write /data/b/t/part-0.parquet: no space left on device"
                "</Message></Error>"
            ),
            "the object store's drives are full",
            "MinIO's drives",
        ),
    ],
)
def test_a_full_disk_is_told_by_whose_disk_it_is(error: OSError, problem: str, fix: str) -> None:
    """A local disk full points at DELTABUS_LOCAL_ROOT; an object store answering that
    its disk is full points at the store's drives (MinIO says either, depending on
    when its drive filled up)."""
    from deltabus.errors import user_storage_error

    clear = user_storage_error(error, "the lake")
    assert clear is not None
    assert clear.problem.startswith(problem) and fix in clear.hint, clear
