"""Failures a user causes or must fix: one clear message and status 2, never a traceback.

Every case runs `python -m deltabus` as a real subprocess against real storage: a
read-only or full filesystem (a tmpfs mounted for the test, when this runs as root; a
directory without write permission otherwise), a MinIO access key whose policy only
reads, a MinIO whose drive is full, a server that accepts connections and never answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pydantic import SecretStr

from deltabus.adapters.dev.minio_process import MinioServer, find_minio
from deltabus.apps.timezones.contracts import INPUT_TABLES
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.core import retry
from deltabus.core.errors import ConfigError, StorageError, user_storage_error
from deltabus.core.settings import Settings, load_settings
from deltabus.delta.lake import PROBE_NAME, Lake
from tests.conftest import IN_CI, TEST_BUCKET, lake_env, minio_settings_for, run_cli
from tests.test_storage_errors import assert_clean_failure, objects_under

IS_ROOT = os.geteuid() == 0


def local_env(lake: Lake, **extra: str) -> tuple[dict[str, str], str]:
    """`lake_env` plus a secret key, so every test can show the secret is never printed."""
    secret = "local-secret-" + secrets.token_hex(8)
    return lake_env(lake) | {"DELTABUS_SECRET_KEY": secret} | extra, secret


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# -- real read-only and full filesystems ----------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (root only; skipped where mounting is refused)."""
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def make_read_only(path: Path) -> None:
    """Make the filesystem at `path` read-only for this user, for real."""
    if IS_ROOT:  # root writes through permissions: remount the tmpfs read-only instead
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    else:
        for p in [path, *path.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)


def make_writable(path: Path) -> None:
    if IS_ROOT:
        subprocess.run(["mount", "-o", "remount,rw", str(path)], check=False)
    else:
        for p in [path, *path.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)


@pytest.fixture
def lake_disk(tmp_path: Path) -> Iterator[Path]:
    """A filesystem of its own for a local lake: a 64 MiB tmpfs as root, else a directory."""
    if IS_ROOT:
        with tmpfs(tmp_path / "disk", "64m") as disk:
            yield disk
            make_writable(disk)
    else:
        disk = tmp_path / "disk"
        disk.mkdir()
        yield disk
        make_writable(disk)


def fill(disk: Path, leave: int) -> None:
    """Fill the filesystem at `disk` until only about `leave` bytes are free."""
    filler = disk / "filler"
    with filler.open("wb") as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
    with contextlib.suppress(OSError):
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    stat = os.statvfs(disk)
    assert stat.f_bavail * stat.f_frsize < leave + (1 << 20)


def produce_some(lake: Lake, count: int = 2000) -> None:
    TimezoneProducer(lake, ProducerConfig(rate=1_000_000, count=count, seed=3)).run()


READ_ONLY_COMMANDS = [["check"], ["produce", "--count", "100"], ["etl"]]


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=lambda c: c[0])
def test_read_only_local_lake(lake_disk: Path, tmp_path: Path, command: list[str]) -> None:
    """A lake on a read-only filesystem: every writing command stops at once, nothing
    written."""
    lake = Lake(Settings(storage="local", local_root=lake_disk, prefix="lake"))
    produce_some(lake)
    versions = {t: DeltaTable(lake.uri(t)).version() for t in INPUT_TABLES}
    before = files_under(lake_disk)
    make_read_only(lake_disk)
    env, secret = local_env(lake)
    started = time.monotonic()
    result = run_cli(command, env, tmp_path)
    expected = "is read-only" if IS_ROOT else "permission denied"
    assert_clean_failure(result, expected, "fix: make it writable", secret=secret)
    assert time.monotonic() - started < 30  # refused, not retried for the retry budget
    assert files_under(lake_disk) == before
    assert {t: DeltaTable(lake.uri(t)).version() for t in INPUT_TABLES} == versions


def test_read_only_error_from_delta_rs_is_recognised(lake_disk: Path) -> None:
    """Past the start-up probe (the disk turning read-only mid-run), delta-rs' own error is
    recognised in the exception chain: not retried, and one clear message."""
    lake = Lake(Settings(storage="local", local_root=lake_disk, prefix="lake"))
    produce_some(lake)
    make_read_only(lake_disk)
    started = time.monotonic()
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the raw error is what is tested
        TimezoneProducer(lake, ProducerConfig(rate=1_000_000, count=500, run_id="late")).run()
    assert time.monotonic() - started < 30, "a read-only disk must not be retried"
    assert not retry.is_transient(caught.value)
    error = user_storage_error(caught.value, lake.settings.describe())
    assert isinstance(error, StorageError), repr(caught.value)
    assert ("is read-only" if IS_ROOT else "permission denied") in str(error)
    assert lake.settings.describe() in str(error)


def test_results_still_work_on_a_read_only_lake(lake_disk: Path, tmp_path: Path) -> None:
    lake = Lake(Settings(storage="local", local_root=lake_disk, prefix="lake"))
    produce_some(lake, count=300)
    env, secret = local_env(lake)
    etl = run_cli(["etl"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-2000:]
    make_read_only(lake_disk)
    exported = run_cli(["results", "--out", str(tmp_path / "r.csv")], env, tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert "wrote 300 rows" in exported.stdout


def test_disk_full_while_producing(tmp_path: Path) -> None:
    """The lake's disk fills up mid-run (the start-up probe still fits)."""
    with tmpfs(tmp_path / "small", "1m") as disk:
        lake = Lake(Settings(storage="local", local_root=disk, prefix="lake"))
        env, secret = local_env(lake)
        result = run_cli(
            ["produce", "--count", "200000", "--rate", "1000000", "--commit-interval-ms", "1000"],
            env,
            tmp_path,
        )
        assert_clean_failure(
            result, "no space left on the lake storage", "fix: free space", secret=secret
        )


def test_disk_full_in_the_etl(tmp_path: Path) -> None:
    """Inputs fit; the ETL's output does not: it stops with the clear message."""
    with tmpfs(tmp_path / "disk", "16m") as disk:
        lake = Lake(Settings(storage="local", local_root=disk, prefix="lake"))
        produce_some(lake, count=60_000)
        fill(disk, leave=64 * 1024)
        env, secret = local_env(lake)
        result = run_cli(["etl"], env, tmp_path, timeout=240)
        assert_clean_failure(
            result, "no space left on the lake storage", "fix: free space", secret=secret
        )


def test_enospc_text_from_delta_rs_is_recognised() -> None:
    """The exact text delta-rs 1.x gives for ENOSPC (seen on a full tmpfs), as a cause."""
    raw = Exception(
        "Failed to parse parquet: External: Generic LocalFileSystem error: Unable to copy "
        "data to file: No space left on device (os error 28)"
    )
    try:
        try:
            raise raw
        except Exception as exc:
            raise RuntimeError("Pathway connector failed") from exc
    except RuntimeError as wrapped:
        error = user_storage_error(wrapped, "local directory /x")
    assert isinstance(error, StorageError)
    assert "no space left on the lake storage (local directory /x)" in str(error)
    assert not retry.is_transient(raw)
    read_only = Exception(
        "Could not create local directory: /x/t1\nError: Os { code: 30, kind: "
        'ReadOnlyFilesystem, message: "Read-only file system" }'
    )
    assert "is read-only" in str(user_storage_error(read_only))


# -- MinIO: a read-only access key, a full drive ----------------------------------------


def _madmin_encrypt(password: str, data: bytes) -> bytes:
    """MinIO's admin payload encryption (madmin EncryptData, PBKDF2 + AES-256-GCM, one
    sio stream fragment), so the test can create a user without `mc`."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

    salt = os.urandom(32)
    key = PBKDF2HMAC(hashes.SHA256(), 32, salt, 8192).derive(password.encode())
    aead, nonce = AESGCM(key), os.urandom(8)
    header_tag = aead.encrypt(nonce + (0).to_bytes(4, "little"), b"", None)
    body = aead.encrypt(nonce + (1).to_bytes(4, "little"), data, b"\x80" + header_tag)
    return salt + b"\x02" + nonce + body


def _admin(server: MinioServer, method: str, path: str, query: dict, body: bytes) -> None:
    """A signed call to MinIO's admin API with the root credentials."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = f"{server.endpoint}/minio/admin/v3/{path}?{urllib.parse.urlencode(query)}"
    request = AWSRequest(method=method, url=url, data=body)
    S3SigV4Auth(Credentials(server.access_key, server.secret_key), "s3", "us-east-1").add_auth(
        request
    )
    prepared = urllib.request.Request(url, data=body, method=method, headers=dict(request.headers))
    with urllib.request.urlopen(prepared, timeout=30) as answer:
        assert answer.status == 200


def read_only_user(server: MinioServer) -> tuple[str, str]:
    """A MinIO user whose policy may list and read the bucket but not write to it."""
    access, secret = "ro-" + secrets.token_hex(4), secrets.token_urlsafe(18)
    policy_name = "deltabus-ro-" + secrets.token_hex(3)
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetBucketLocation", "s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{TEST_BUCKET}"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{TEST_BUCKET}/*"],
            },
        ],
    }
    _admin(server, "PUT", "add-canned-policy", {"name": policy_name}, json.dumps(policy).encode())
    user = json.dumps({"secretKey": secret, "status": "enabled"}).encode()
    _admin(
        server, "PUT", "add-user", {"accessKey": access}, _madmin_encrypt(server.secret_key, user)
    )
    _admin(
        server,
        "PUT",
        "set-user-or-group-policy",
        {"policyName": policy_name, "userOrGroup": access, "isGroup": "false"},
        b"",
    )
    return access, secret


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=lambda c: c[0])
def test_read_only_minio_key(minio: MinioServer, minio_lake: Lake, tmp_path: Path, command) -> None:
    produce_some(minio_lake, count=500)
    before = objects_under(minio, minio_lake)
    access, secret = read_only_user(minio)
    env = lake_env(minio_lake) | {"DELTABUS_ACCESS_KEY": access, "DELTABUS_SECRET_KEY": secret}
    result = run_cli(command, env, tmp_path)
    assert_clean_failure(
        result,
        f"access key '{access}' from DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY may not write",
        "s3:PutObject",
        secret=secret,
    )
    assert minio.secret_key not in result.stdout + result.stderr
    assert objects_under(minio, minio_lake) == before


def test_access_denied_from_delta_rs_is_recognised(minio: MinioServer, minio_lake: Lake) -> None:
    """A read-only key past the probe: delta-rs' AccessDenied, in the chain, not retried."""
    produce_some(minio_lake, count=200)
    access, secret = read_only_user(minio)
    lake = Lake(
        minio_lake.settings.model_copy(
            update={"access_key": access, "secret_key": SecretStr(secret)}
        )
    )
    started = time.monotonic()
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the raw error is what is tested
        TimezoneProducer(lake, ProducerConfig(rate=1_000_000, count=100, run_id="ro")).run()
    assert time.monotonic() - started < 30
    error = user_storage_error(caught.value)
    assert isinstance(error, StorageError) and "denied access" in str(error), repr(caught.value)


def test_minio_drive_full(tmp_path: Path) -> None:
    """MinIO's own drive fills up: the producer stops with MinIO's reason, clearly."""
    binary = find_minio()
    if binary is None:
        if IN_CI:
            pytest.fail("MinIO is required in CI")
        pytest.skip("no MinIO binary")
    with tmpfs(tmp_path / "minio-disk", "48m") as disk:
        server = MinioServer(
            disk / "data", "full-" + secrets.token_hex(3), secrets.token_urlsafe(18), binary=binary
        )
        server.start()
        try:
            lake = Lake(minio_settings_for(server, "full"))
            lake.init_bucket()
            fill(disk, leave=200 * 1024)
            env = lake_env(lake)
            result = run_cli(
                ["produce", "--count", "100000", "--rate", "1000000"], env, tmp_path, timeout=240
            )
            assert_clean_failure(
                result, "drives are full", "fix: free space on MinIO", secret=server.secret_key
            )
        finally:
            server.stop()


# -- a server that accepts connections and never answers ------------------------------


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP server on a free loopback port that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize(
    "command", [["check"], ["produce", "--count", "10"], ["init-bucket"]], ids=lambda c: c[0]
)
def test_unresponsive_minio_at_start_up(
    minio_lake: Lake, silent_endpoint: str, tmp_path: Path, command
) -> None:
    env = lake_env(minio_lake) | {
        "DELTABUS_MINIO_ENDPOINT": silent_endpoint,
        "DELTABUS_RETRY_MAX_WAIT_S": "3",
    }
    started = time.monotonic()
    result = run_cli(command, env, tmp_path, timeout=120)
    elapsed = time.monotonic() - started
    assert_clean_failure(
        result,
        f"MinIO at {silent_endpoint} accepts connections but does not answer",
        "DELTABUS_RETRY_MAX_WAIT_S",
        secret=env["DELTABUS_SECRET_KEY"],
    )
    assert "retrying" in result.stderr  # it waited through the retry budget...
    assert 2.5 < elapsed < 30  # ...and no longer


def test_retry_budget_from_env_file(minio_lake: Lake, silent_endpoint: str, tmp_path: Path) -> None:
    """DELTABUS_RETRY_MAX_WAIT_S in ./.env bounds the wait as the variable does."""
    env = lake_env(minio_lake) | {"DELTABUS_MINIO_ENDPOINT": silent_endpoint}
    env.pop("DELTABUS_RETRY_MAX_WAIT_S")
    env.pop("DELTABUS_ENV_FILE", None)  # read ./.env, as a user would
    (tmp_path / ".env").write_text("DELTABUS_RETRY_MAX_WAIT_S=2\n")
    started = time.monotonic()
    result = run_cli(["check"], env, tmp_path, timeout=120)
    assert result.returncode == 2 and "does not answer" in result.stderr, result.stderr[-2000:]
    assert time.monotonic() - started < 20


# -- configuration: .env, numbers, prefixes ---------------------------------------------


def test_non_utf8_env_file_in_the_working_directory(local_lake: Lake, tmp_path: Path) -> None:
    (tmp_path / ".env").write_bytes(b"DELTABUS_PREFIX=caf\xe9\n")
    env, secret = local_env(local_lake)
    env.pop("DELTABUS_ENV_FILE", None)  # read ./.env, as a user would
    result = run_cli(["check"], env, tmp_path)
    assert_clean_failure(result, ".env is not UTF-8 text", "fix: save it", secret=secret)
    assert not Path(local_lake.root).exists()


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", ""])
def test_invalid_retry_budget(local_lake: Lake, tmp_path: Path, value: str) -> None:
    env, secret = local_env(local_lake, DELTABUS_RETRY_MAX_WAIT_S=value)
    result = run_cli(["produce", "--count", "10"], env, tmp_path)
    assert_clean_failure(result, "DELTABUS_RETRY_MAX_WAIT_S", "configuration error", secret=secret)
    assert not Path(local_lake.root).exists()


def test_invalid_retry_budget_in_env_file(local_lake: Lake, tmp_path: Path) -> None:
    env, secret = local_env(local_lake)
    env.pop("DELTABUS_RETRY_MAX_WAIT_S")
    env.pop("DELTABUS_ENV_FILE", None)  # read ./.env, as a user would
    (tmp_path / ".env").write_text("DELTABUS_RETRY_MAX_WAIT_S=soon\n")
    result = run_cli(["check"], env, tmp_path)
    assert_clean_failure(result, "DELTABUS_RETRY_MAX_WAIT_S='soon'", secret=secret)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("DELTABUS_CHECKPOINT_INTERVAL", "often"), ("DELTABUS_LOG_RETENTION_S", "-5")],
)
def test_invalid_numbers_name_their_variable(
    local_lake: Lake, tmp_path: Path, variable: str, value: str
) -> None:
    env, secret = local_env(local_lake, **{variable: value})
    result = run_cli(["check"], env, tmp_path)
    assert_clean_failure(result, f"{variable}='{value}'", secret=secret)


def test_retry_budget_of_processes_with_only_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    retry.configure(None)
    monkeypatch.setenv("DELTABUS_RETRY_MAX_WAIT_S", "abc")
    with pytest.raises(ConfigError, match="DELTABUS_RETRY_MAX_WAIT_S='abc'"):
        retry.max_wait_s()
    monkeypatch.setenv("DELTABUS_RETRY_MAX_WAIT_S", "-2")
    with pytest.raises(ConfigError, match="DELTABUS_RETRY_MAX_WAIT_S"):
        retry.max_wait_s()
    monkeypatch.setenv("DELTABUS_RETRY_MAX_WAIT_S", "7.5")
    assert retry.max_wait_s() == 7.5
    monkeypatch.delenv("DELTABUS_RETRY_MAX_WAIT_S")
    assert retry.max_wait_s() == 300
    assert load_settings().retry_max_wait_s == 300


UNSAFE_PREFIXES = ["..", "a/../../escape", "/abs/path", "a//b", "./lake", "a/./b", "", "sp ace"]


@pytest.mark.parametrize("prefix", UNSAFE_PREFIXES)
@pytest.mark.parametrize("how", ["env", "option"])
def test_unsafe_prefix_is_refused(tmp_path: Path, prefix: str, how: str) -> None:
    root = tmp_path / "root" / "lake"
    lake = Lake(Settings(storage="local", local_root=root, prefix="lake"))
    env, secret = local_env(lake)
    if how == "env":
        env["DELTABUS_PREFIX"] = prefix
        args, named = ["produce", "--count", "10"], "DELTABUS_PREFIX"
    else:
        args, named = ["--prefix", prefix, "produce", "--count", "10"], "--prefix"
    result = run_cli(args, env, tmp_path)
    assert_clean_failure(result, named, "configuration error", "fix: ", secret=secret)
    assert files_under(tmp_path) == [], "nothing may be written, inside or outside the root"


@pytest.mark.parametrize("prefix", UNSAFE_PREFIXES)
def test_with_prefix_validates(prefix: str) -> None:
    settings = Settings(storage="local", prefix="lake")
    with pytest.raises(ConfigError, match="invalid lake prefix"):
        settings.with_prefix(prefix)
    with pytest.raises(ValueError, match="prefix"):
        Settings(storage="local", prefix=prefix)


def test_safe_prefixes_still_work() -> None:
    settings = Settings(storage="local", prefix="lake/")
    assert settings.prefix == "lake"
    assert settings.with_prefix("lake/bench/20260101-000000-ab12/delta-10000/").prefix == (
        "lake/bench/20260101-000000-ab12/delta-10000"
    )
    assert settings.with_prefix("team_a/x=1/v1.2").prefix == "team_a/x=1/v1.2"


# -- a foreign schema on an input table ---------------------------------------------------


FOREIGN = {
    "extra column": ("timezone1", pa.table({"date": ["x"], "message": ["m"], "extra": ["e"]})),
    "message as int64": (
        "timezone2",
        pa.table({"date": ["x"], "message": pa.array([1], pa.int64())}),
    ),
}


@pytest.mark.parametrize("case", list(FOREIGN))
def test_foreign_input_schema_is_refused_before_writing(
    lake: Lake, tmp_path: Path, case: str
) -> None:
    table, data = FOREIGN[case]
    other = next(t for t in INPUT_TABLES if t != table)
    if table == "timezone2":  # the other table exists with the contract: it must not change
        produce_some(lake, count=50)
        write_deltalake(
            lake.uri(table),
            data,
            mode="overwrite",
            schema_mode="overwrite",
            storage_options=lake.storage_options,
        )
    else:  # the other table does not exist: it must not be created
        write_deltalake(lake.uri(table), data, storage_options=lake.storage_options)
    versions = {t: lake.open(t).version() if lake.exists(t) else None for t in INPUT_TABLES}
    env = lake_env(lake)
    secret = env.get("DELTABUS_SECRET_KEY", "no-secret-" + uuid.uuid4().hex)
    result = run_cli(["produce", "--count", "1000", "--rate", "100000"], env, tmp_path)
    assert_clean_failure(
        result,
        f"table {table} at",
        "not the input contract",
        "nothing was written",
        "fix: point DELTABUS_PREFIX",
        secret=secret,
    )
    after = {t: lake.open(t).version() if lake.exists(t) else None for t in INPUT_TABLES}
    assert after == versions, f"{other} was written to"


def test_check_probes_writability_and_leaves_nothing(lake: Lake, tmp_path: Path) -> None:
    """`deltabus check` writes a probe under the lake root and removes it (and the root
    directories it had to create on local disk)."""
    result = run_cli(["check"], lake_env(lake), tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    if lake.is_local:
        assert not Path(lake.settings.local_root).exists()
    else:
        client = lake.s3_client()
        listing = client.list_objects_v2(Bucket=lake.settings.bucket, Prefix=lake.settings.prefix)
        keys = [o["Key"] for o in listing.get("Contents", [])]
        assert f"{lake.settings.prefix}/{PROBE_NAME}" not in keys and keys == []


@pytest.mark.parametrize("where", ["read-only directory", "a directory"])
def test_results_out_that_cannot_be_written(
    lake_disk: Path, local_lake: Lake, tmp_path: Path, where: str
) -> None:
    produce_some(local_lake, count=100)
    env, secret = local_env(local_lake)
    assert run_cli(["etl"], env, tmp_path).returncode == 0
    if where == "a directory":
        out, expected = lake_disk, "is a directory"
    else:
        make_read_only(lake_disk)
        out, expected = lake_disk / "sub" / "r.csv", "cannot write in"
    result = run_cli(["results", "--out", str(out)], env, tmp_path)
    assert_clean_failure(result, f"--out {out}", expected, "fix: ", secret=secret)


def test_notify_options_that_cannot_work_are_refused(
    minio: MinioServer, minio_lake: Lake, tmp_path: Path
) -> None:
    """`bench --notify` on the configured lake (it starts its own MinIO and relay) and a
    relay on a port already taken: one message with the fix, nothing written."""
    env = lake_env(minio_lake)
    secret = minio_lake.settings.secret_key.get_secret_value()  # type: ignore[union-attr]
    out = tmp_path / "out"
    result = run_cli(["bench", "--notify", "--no-local-minio", "--out", str(out)], env, tmp_path)
    assert_clean_failure(result, "--notify", "--local-minio", "DELTABUS_NOTIFY_URL", secret=secret)
    assert not objects_under(minio, minio_lake)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(["notify", "relay", "--port", str(port)], env, tmp_path, timeout=60)
    assert_clean_failure(result, f"cannot listen on 127.0.0.1:{port}", "--port", secret=secret)


def test_a_run_id_outside_the_producer_id_alphabet_is_refused(
    local_lake: Lake, tmp_path: Path
) -> None:
    """The run id is the input streams' producer id: exit 2 with the alphabet, nothing
    written."""
    env = lake_env(local_lake)
    refused = run_cli(
        ["produce", "--run-id", "Run#1", "--count", "10", "--rate", "100"], env, tmp_path
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "run id 'Run#1' is not usable" in refused.stderr
    assert "lower-case letters, digits" in refused.stderr
    assert not local_lake.exists("timezone1") and not local_lake.exists("timezone2")
