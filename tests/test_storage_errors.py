"""Bucket, credential and endpoint errors: one clear message, exit 2, nothing written; and
transient or permanent storage errors told apart by class, status and code, not by text."""

from __future__ import annotations

import http.client
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from deltabus.adapters.dev.minio_process import MinioServer, find_minio
from deltabus.apps.timezones.producer import ProducerConfig
from deltabus.core.errors import ConfigError
from deltabus.core.net import free_port
from deltabus.core.settings import load_settings
from deltabus.delta.lake import Lake
from deltabus.delta.table_files import RangedFile
from tests.conftest import IN_CI, lake_env, minio_settings_for, run_cli

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
    assert "no credentials for the lake" in result.stderr
    assert "DELTABUS_SECRET_KEY" in result.stderr and "AWS_PROFILE" in result.stderr


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


# -- transient or permanent: told by class, HTTP status, error code or SQLSTATE -------------

VACUUMED = "lake/timezone1/part-00001-7e503a1c-5f0e-4c1a-9d47-2b1f3c6a8e90-c000.snappy.parquet"

# Messages as the libraries word them, with names that hold "503", "500", "timeout".
MESSAGES = [
    (
        "corrupt footer, 503 in the file's uuid",
        False,
        "Parquet error: Corrupt footer: s3://deltabus/lake/timezone1/"
        "part-00001-7e503a1c-5f0e-4c1a-9d47-2b1f3c6a8e90-c000.snappy.parquet",
    ),
    (
        "corrupt footer, 513 in the file's uuid",
        False,
        "Parquet error: Corrupt footer: s3://deltabus/lake/timezone1/"
        "part-00001-7e513a1c-5f0e-4c1a-9d47-2b1f3c6a8e90-c000.snappy.parquet",
    ),
    (
        "delta-rs: metadata of a vacuumed file",
        False,
        f"Parquet error: Failed to fetch metadata for file {VACUUMED}: Object Store error: "
        f"Object at location {VACUUMED} not found: Error performing GET "
        f"http://127.0.0.1:9000/deltabus/{VACUUMED} in 612µs - Server returned non-2xx status "
        "code: 404 Not Found: <Error><Code>NoSuchKey</Code></Error>",
    ),
    (
        "delta-rs: metadata of a file during an outage",
        True,
        f"Parquet error: Failed to fetch metadata for file {VACUUMED}: Object Store error: "
        f"Generic S3 error: Error performing GET http://127.0.0.1:9000/deltabus/{VACUUMED} in "
        "2.1s, after 10 retries, max_retries: 10, retry_timeout: 180s  - HTTP error: error "
        "sending request",
    ),
    (
        "a timeout in a table name is not a timeout",
        False,
        "Schema error: table timeout_500_stats has no column named 'date'",
    ),
    (
        "object_store: MinIO initializing",
        True,
        "Generic S3 error: Error performing GET http://127.0.0.1:9000/b/t/_delta_log/"
        "_last_checkpoint in 3ms - Server returned non-2xx status code: 503 Service "
        "Unavailable: <Error><Code>XMinioServerNotInitialized</Code></Error>",
    ),
    (
        "object_store: 200 with an InternalError body",
        True,
        "Generic S3 error: Error performing PUT http://127.0.0.1:9000/b/t/x in 3ms - Server "
        "returned error response: <Error><Code>InternalError</Code></Error>",
    ),
    (
        "older object_store: no answer",
        True,
        "Generic S3 error: error sending request for url (http://127.0.0.1:1/x)",
    ),
    ("wrong secret", False, "S3 error: SignatureDoesNotMatch"),
    ("schema mismatch", False, "Schema error: Cannot cast schema, number of fields does not match"),
    ("Rust io error: connection reset", True, "Io error: Connection reset by peer (os error 104)"),
]


@pytest.mark.parametrize(
    ("transient", "message"), [m[1:] for m in MESSAGES], ids=[m[0] for m in MESSAGES]
)
def test_transient_errors_are_told_from_permanent_ones(message: str, transient: bool) -> None:
    from deltabus.core.retry import is_transient

    assert is_transient(OSError(message)) is transient
    assert is_transient(DeltaError(message)) is transient
    wrapped = RuntimeError("a connector failed")
    wrapped.__cause__ = OSError(message)
    assert is_transient(wrapped) is transient


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please '
    b"reduce your request rate</Message></Error>"
)


class ServiceUnavailableProxy(ThreadingHTTPServer):
    """An endpoint in front of a real MinIO that answers 503 SlowDown (as MinIO does when
    overloaded) until `available_at`, then forwards every request to the MinIO."""

    daemon_threads = True

    def __init__(self, target: str, available_at: float = math.inf) -> None:
        self.target = urlsplit(target)
        self.available_at = available_at
        self.answered_503 = 0
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ServiceUnavailableProxy

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if time.monotonic() < self.server.available_at:
            self.server.answered_503 += 1
            self.send_response(503, "Service Unavailable")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOW_DOWN)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(SLOW_DOWN)
            return
        target = self.server.target
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:  # the Host header goes as signed: MinIO checks the signature against it
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            answer = conn.getresponse()
            data = answer.read()
        finally:
            conn.close()
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        size = answer.getheader("Content-Length") if self.command == "HEAD" else len(data)
        self.send_header("Content-Length", str(size or 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle

    def log_message(self, *args: object) -> None:
        pass


def caught(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the error is what the test looks at
        return exc
    raise AssertionError("no error raised")


@dataclass
class Lab:
    """A MinIO of the module's own, a lake on it, and a one-file Delta table."""

    server: MinioServer
    lake: Lake
    file_key: str  # the table's data file, relative to the lake prefix

    def uri(self) -> str:
        return self.lake.uri("t")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    binary = find_minio()
    if binary is None:
        if IN_CI:
            pytest.fail("MinIO is required in CI: run `make minio-bin` first")
        pytest.skip("no MinIO binary (set DELTABUS_MINIO_BIN)")
    server = MinioServer(
        tmp_path_factory.mktemp("errors-minio") / "data",
        "errors-key",
        "errors-secret-" + "x" * 10,
        free_port(),
        binary,
    )
    server.start()
    lake = Lake(minio_settings_for(server, "lab"))
    lake.init_bucket()
    write_deltalake(
        lake.uri("t"), pa.table({"a": list(range(100))}), storage_options=lake.storage_options
    )
    dt = DeltaTable(lake.uri("t"), storage_options=lake.storage_options)
    (uri,) = dt.file_uris()
    yield Lab(server, lake, "t/" + uri.rsplit("/", 1)[1])
    server.stop()


def _clients(lake: Lake, key: str) -> dict[str, Callable[[], object]]:
    """One read of `key` (and of the table) through each client deltabus uses."""
    s = lake.settings
    options = lake.storage_options

    return {
        "delta-rs open": lambda: DeltaTable(lake.uri("t"), storage_options=options),
        "delta-rs read": lambda: DeltaTable(
            lake.uri("t"), storage_options=options
        ).to_pyarrow_table(),
        "delta-rs scan": lambda: pa.table(
            DeltaTable(lake.uri("t"), storage_options=options).scan()
        ),
        "obstore get": lambda: obstore.get(lake.object_store, key).bytes(),
        "ranged read": lambda: pq.read_table(RangedFile(lake.object_store, key)),
        "boto3 get": lambda: lake.s3_client().get_object(Bucket=s.bucket, Key=f"{s.prefix}/{key}"),
    }


# (situation, client, transient). Each error is raised for real against the lab's MinIO.
LIVE = [
    *(("corrupt file", c, False) for c in ("delta-rs read", "delta-rs scan", "ranged read")),
    *(
        ("vacuumed file", c, False)
        for c in ("delta-rs read", "delta-rs scan", "obstore get", "ranged read", "boto3 get")
    ),
    *(
        ("503 answer", c, True)
        for c in ("delta-rs open", "obstore get", "ranged read", "boto3 get")
    ),
    *(("outage", c, True) for c in ("delta-rs open", "obstore get", "ranged read", "boto3 get")),
]


def _raise_each(
    errors: dict[tuple[str, str], BaseException], situation: str, lake: Lake, key: str
) -> None:
    clients = _clients(lake, key)
    for name in (c for s, c, _ in LIVE if s == situation):
        errors[situation, name] = caught(clients[name])


@pytest.fixture(scope="module")
def live_errors(lab: Lab) -> dict[tuple[str, str], BaseException]:
    """The error of every (situation, client) of LIVE, raised against a real MinIO."""
    errors: dict[tuple[str, str], BaseException] = {}
    s = lab.lake.settings
    s3 = lab.lake.s3_client()
    key = f"{s.prefix}/{lab.file_key}"
    original = s3.get_object(Bucket=s.bucket, Key=key)["Body"].read()
    # As long as the file the log names, magic bytes at both ends, no Parquet inside.
    s3.put_object(Bucket=s.bucket, Key=key, Body=b"PAR1" + bytes(len(original) - 8) + b"PAR1")
    _raise_each(errors, "corrupt file", lab.lake, lab.file_key)
    s3.delete_object(Bucket=s.bucket, Key=key)  # vacuumed behind the table's back
    _raise_each(errors, "vacuumed file", lab.lake, lab.file_key)
    s3.put_object(Bucket=s.bucket, Key=key, Body=original)
    proxy = ServiceUnavailableProxy(lab.server.endpoint)
    try:
        behind = Lake(s.model_copy(update={"minio_endpoint": proxy.endpoint}))
        _raise_each(errors, "503 answer", behind, lab.file_key)
    finally:
        proxy.shutdown()
    assert proxy.answered_503 > 0
    lab.server.stop()
    try:
        _raise_each(errors, "outage", lab.lake, lab.file_key)
    finally:
        lab.server.start()
    return errors


@pytest.mark.parametrize(
    ("situation", "client", "transient"), LIVE, ids=[f"{s}, {c}" for s, c, _ in LIVE]
)
def test_real_storage_errors_are_told_apart(
    live_errors: dict[tuple[str, str], BaseException], situation: str, client: str, transient: bool
) -> None:
    from deltabus.core.retry import is_transient

    error = live_errors[situation, client]
    assert is_transient(error) is transient, f"{type(error).__name__}: {error}"


def test_permanent_errors_stop_at_once_and_outages_are_ridden_out(lab: Lab) -> None:
    """retry_storage with a 60 s budget: a corrupt or vacuumed file fails within a
    second; a MinIO down for a few seconds, and one answering 503, are waited out."""
    from deltabus.core import retry

    s = lab.lake.settings
    s3 = lab.lake.s3_client()
    key = f"{s.prefix}/{lab.file_key}"
    original = s3.get_object(Bucket=s.bucket, Key=key)["Body"].read()
    read = _clients(lab.lake, lab.file_key)["delta-rs read"]
    try:
        for broken in (b"PAR1" + bytes(len(original) - 8) + b"PAR1", None):
            if broken is None:
                s3.delete_object(Bucket=s.bucket, Key=key)
            else:
                s3.put_object(Bucket=s.bucket, Key=key, Body=broken)
            started = time.monotonic()
            with pytest.raises(Exception) as failed:  # noqa: B017 - any of the libraries'
                retry.retry_storage(read, what="read t", max_wait=60)
            assert time.monotonic() - started < 2, failed.value
    finally:
        s3.put_object(Bucket=s.bucket, Key=key, Body=original)

    lab.server.stop()
    threading.Timer(2.0, lab.server.start).start()
    started = time.monotonic()
    table = retry.retry_storage(read, what="read t", max_wait=60)
    assert table.num_rows == 100 and time.monotonic() - started >= 2
    lab.server.wait_ready()

    proxy = ServiceUnavailableProxy(lab.server.endpoint, time.monotonic() + 2.0)
    try:
        behind = Lake(s.model_copy(update={"minio_endpoint": proxy.endpoint}))
        for client in ("obstore get", "ranged read", "delta-rs read"):
            proxy.available_at = time.monotonic() + 1.5
            before = proxy.answered_503
            got = retry.retry_storage(
                _clients(behind, lab.file_key)[client], what=client, max_wait=60
            )
            assert got is not None and proxy.answered_503 > before, client
    finally:
        proxy.shutdown()


def test_sqlstate_decides_for_postgresql(postgres) -> None:
    """psycopg2's errors by SQLSTATE: a syntax error is permanent, a backend terminated by
    the server transient; without a SQLSTATE, libpq's refused connection is transient and
    a wrong password is not."""
    import psycopg2
    from psycopg2.extensions import make_dsn, parse_dsn

    from deltabus.core.retry import is_transient

    conn = psycopg2.connect(postgres.dsn)
    other = psycopg2.connect(postgres.dsn)
    try:
        syntax = caught(lambda: conn.cursor().execute("SELEKT 1"))
        assert getattr(syntax, "pgcode", None) == "42601" and not is_transient(syntax)
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            (pid,) = cur.fetchone()
        other.autocommit = True
        other.cursor().execute("SELECT pg_terminate_backend(%s)", (pid,))
        terminated = caught(lambda: conn.cursor().execute("SELECT 1"))
        assert is_transient(terminated), (getattr(terminated, "pgcode", None), terminated)
    finally:
        other.close()
        conn.close()
    params = parse_dsn(postgres.dsn)
    refused = caught(lambda: psycopg2.connect(make_dsn(**params | {"port": str(free_port())})))
    assert is_transient(refused), refused
    wrong = caught(lambda: psycopg2.connect(make_dsn(**params | {"password": "not-it-42"})))
    assert not is_transient(wrong), wrong


def test_a_stop_cuts_an_outage_retry_short_but_rides_out_a_blip():
    """retry_storage under `stop_waiting_on`: once the stop is set it tries a few more
    seconds (a blip passes), then raises a clear error instead of waiting out its budget."""
    import threading
    import time

    from deltabus.core import retry

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
    from deltabus.core.errors import user_storage_error

    clear = user_storage_error(error, "the lake")
    assert clear is not None
    assert clear.problem.startswith(problem) and fix in clear.hint, clear
