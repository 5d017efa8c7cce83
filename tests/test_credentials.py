"""Standard AWS credentials on the real MinIO: STS temporary keys, a shared-file profile,
and a rejected token that stops a command before anything is written.

No DELTABUS secret is set in these runs: the keys come from the AWS chain only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from botocore.config import Config

from deltabus.core.errors import ConfigError
from deltabus.core.processes import child_env
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake
from tests.conftest import TEST_BUCKET, minio_settings_for, run_cli
from tests.helpers import assert_exactly_once

pytestmark = pytest.mark.timeout(300)

STREAM_SCHEMA = "order_id:int64!,customer:string"


def assume_role(minio: Any, seconds: int = 900) -> dict[str, str]:
    """Temporary credentials from MinIO's STS AssumeRole, asked with the root keys."""
    sts = boto3.client(
        "sts",
        endpoint_url=minio.endpoint,
        aws_access_key_id=minio.access_key,
        aws_secret_access_key=minio.secret_key,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}),
    )
    answer = sts.assume_role(
        RoleArn="arn:aws:iam::000000000000:role/deltabus",
        RoleSessionName="deltabus-test",
        DurationSeconds=seconds,
    )["Credentials"]
    assert answer["SessionToken"], "MinIO's STS gave no session token"
    return {
        "AWS_ACCESS_KEY_ID": answer["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": answer["SecretAccessKey"],
        "AWS_SESSION_TOKEN": answer["SessionToken"],
    }


def chain_env(minio: Any, prefix: str, aws: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A `deltabus` environment with no DELTABUS key at all, only `aws` variables."""
    settings = minio_settings_for(minio, prefix, access_key="unused", secret_key=None)
    env = child_env(settings)
    for name in [k for k in env if k.startswith("AWS_")]:
        del env[name]
    env.pop("DELTABUS_ACCESS_KEY")
    env["AWS_CONFIG_FILE"] = str(tmp_path / "no-aws-config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "no-aws-credentials")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env.update(aws)
    assert "DELTABUS_SECRET_KEY" not in env and "MINIO_S3_SECRET_ACCESS_KEY" not in env
    assert minio.secret_key not in env.values()
    return env


def root_lake(minio: Any, prefix: str) -> Lake:
    return Lake(minio_settings_for(minio, prefix))


def objects_under(lake: Lake) -> list[str]:
    listing = lake.s3_client().list_objects_v2(
        Bucket=TEST_BUCKET, Prefix=f"{lake.settings.prefix}/"
    )
    return [o["Key"] for o in listing.get("Contents", [])]


def stream_round_trip(env: dict[str, str], cwd: Path, records: int = 50) -> None:
    """Create a stream, produce `records` JSON lines into it, consume them all back."""
    created = run_cli(
        [
            "streams",
            "create",
            "orders",
            "--partitions",
            "2",
            "--key",
            "customer",
            "--schema",
            STREAM_SCHEMA,
        ],
        env,
        cwd,
    )
    assert created.returncode == 0, created.stderr[-2000:]
    lines = "".join(
        json.dumps({"order_id": i, "customer": f"c{i % 7}"}) + "\n" for i in range(records)
    )
    produced = run_cli(
        ["produce", "--stream", "orders", "--producer-id", "p1"], env, cwd, input=lines
    )
    assert produced.returncode == 0, produced.stderr[-2000:]
    consumed = run_cli(
        ["consume", "--stream", "orders", "--group", "g1", "--idle-exit-s", "3"], env, cwd
    )
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    ids = sorted(json.loads(line)["order_id"] for line in consumed.stdout.splitlines() if line)
    assert ids == list(range(records))


def test_temporary_credentials_from_sts_run_the_bus_and_the_etl(minio, tmp_path: Path) -> None:
    """AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN from AssumeRole, and
    no static secret anywhere: streams, the time-zone producer and the ETL all work."""
    prefix = f"sts-{os.getpid()}"
    aws = assume_role(minio)
    env = chain_env(minio, prefix, aws, tmp_path)
    stream_round_trip(env, tmp_path)

    produced = run_cli(
        [
            "produce",
            "--rate",
            "500",
            "--duration",
            "2",
            "--commit-interval-ms",
            "100",
            "--seed",
            "3",
        ],
        env,
        tmp_path,
    )
    assert produced.returncode == 0, produced.stderr[-2000:]
    etl = run_cli(["etl", "--mode", "bounded"], env, tmp_path)
    assert etl.returncode == 0, etl.stderr[-2000:]
    assert_exactly_once(root_lake(minio, prefix), expected=1000)
    for secret in (aws["AWS_SECRET_ACCESS_KEY"], aws["AWS_SESSION_TOKEN"]):
        assert secret not in produced.stdout + produced.stderr + etl.stdout + etl.stderr


def test_profile_in_a_shared_credentials_file(minio, tmp_path: Path) -> None:
    """AWS_PROFILE names a profile of AWS_SHARED_CREDENTIALS_FILE holding temporary keys."""
    aws = assume_role(minio)
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[default]\naws_access_key_id = not-this-one\naws_secret_access_key = nor-this\n\n"
        "[streaming]\n"
        f"aws_access_key_id = {aws['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {aws['AWS_SECRET_ACCESS_KEY']}\n"
        f"aws_session_token = {aws['AWS_SESSION_TOKEN']}\n"
    )
    env = chain_env(minio, f"profile-{os.getpid()}", {}, tmp_path)
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(credentials)
    env["AWS_PROFILE"] = "streaming"
    checked = run_cli(["check"], env, tmp_path)
    assert checked.returncode == 0, checked.stderr[-2000:]
    stream_round_trip(env, tmp_path)


@pytest.mark.parametrize("wrong", ["token", "secret"])
def test_a_rejected_temporary_credential_stops_before_writing(
    minio, tmp_path: Path, wrong: str
) -> None:
    """A tampered session token (or secret) ends `deltabus produce` with exit 2 and one
    line naming the credentials and the fix; no secret printed, nothing written."""
    prefix = f"bad-{wrong}-{os.getpid()}"
    aws = assume_role(minio)
    if wrong == "token":
        aws["AWS_SESSION_TOKEN"] = aws["AWS_SESSION_TOKEN"][:-12] + "A" * 12
    else:
        aws["AWS_SECRET_ACCESS_KEY"] = "x" * len(aws["AWS_SECRET_ACCESS_KEY"])
    env = chain_env(minio, prefix, aws, tmp_path)
    result = run_cli(
        ["produce", "--rate", "100", "--duration", "1", "--seed", "1"], env, tmp_path, timeout=120
    )
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("deltabus: error")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "rejected the credentials" in errors[0]
    assert "AWS_SESSION_TOKEN" in errors[0] and aws["AWS_ACCESS_KEY_ID"] in errors[0]
    assert "Traceback" not in result.stderr
    for secret in (aws["AWS_SECRET_ACCESS_KEY"], aws["AWS_SESSION_TOKEN"]):
        assert secret not in result.stdout + result.stderr
    assert objects_under(root_lake(minio, prefix)) == []


def test_static_keys_with_a_session_token(minio, tmp_path: Path) -> None:
    """DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY / DELTABUS_SESSION_TOKEN, temporary keys
    given the deltabus way; the AWS_* variables of the parent do not reach the child."""
    aws = assume_role(minio)
    settings = minio_settings_for(
        minio,
        f"static-token-{os.getpid()}",
        access_key=aws["AWS_ACCESS_KEY_ID"],
        secret_key=aws["AWS_SECRET_ACCESS_KEY"],
        session_token=aws["AWS_SESSION_TOKEN"],
    )
    env = child_env(settings)
    assert env["DELTABUS_SESSION_TOKEN"] == aws["AWS_SESSION_TOKEN"]
    stream_round_trip(env, tmp_path)


def test_children_keep_the_aws_chain_only_when_it_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::000000000000:role/r")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token")
    chain = child_env(Settings(storage="s3", bucket="b1b", prefix="lake"))
    assert chain["AWS_ROLE_ARN"] == "arn:aws:iam::000000000000:role/r"
    assert "DELTABUS_MINIO_ENDPOINT" not in chain  # AWS S3: the region's endpoint
    static = child_env(Settings(storage="minio", secret_key="s3cr3t-value", prefix="lake"))
    assert "AWS_ROLE_ARN" not in static and "AWS_WEB_IDENTITY_TOKEN_FILE" not in static


def test_aws_s3_is_virtual_hosted_with_its_region_and_minio_path_style() -> None:
    aws = Lake(
        Settings(
            storage="s3",
            bucket="team-lake",
            region="eu-west-3",
            secret_key="s3cr3t-value",
            storage_options={"aws_server_side_encryption": "aws:kms"},
        )
    )
    options = aws.storage_options
    assert options is not None
    assert options["AWS_REGION"] == "eu-west-3"
    assert options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "true"
    assert "AWS_ENDPOINT_URL" not in options
    assert options["aws_server_side_encryption"] == "aws:kms"
    assert aws.object_store.config["virtual_hosted_style_request"] == "true"
    minio = Lake(Settings(storage="minio", secret_key="s3cr3t-value"))
    assert minio.storage_options["AWS_S3_ADDRESSING_STYLE"] == "path"  # type: ignore[index]
    assert minio.object_store.config["virtual_hosted_style_request"] == "false"


def test_an_unknown_storage_option_is_a_clear_error() -> None:
    lake = Lake(
        Settings(storage="minio", secret_key="s3cr3t-value", storage_options={"no_such": "1"})
    )
    with pytest.raises(ConfigError, match="DELTABUS_STORAGE_OPTIONS"):
        lake.object_store  # noqa: B018


def test_temporary_credentials_are_refreshed_before_they_expire(
    minio, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile whose `credential_process` hands out STS keys said to expire at once: each
    client deltabus makes (obstore, delta-rs, boto3) gets fresh keys from the chain, and
    the lake keeps working with them."""
    calls = tmp_path / "calls"
    script = tmp_path / "issue_keys.py"
    script.write_text(
        "import datetime, json, pathlib, boto3\n"
        f"pathlib.Path({str(calls)!r}).open('a').write('x')\n"
        f"sts = boto3.client('sts', endpoint_url={minio.endpoint!r}, region_name='us-east-1',"
        f" aws_access_key_id={minio.access_key!r}, aws_secret_access_key={minio.secret_key!r})\n"
        "c = sts.assume_role(RoleArn='arn:aws:iam::000000000000:role/r',"
        " RoleSessionName='rotate', DurationSeconds=900)['Credentials']\n"
        "soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': c['AccessKeyId'],"
        " 'SecretAccessKey': c['SecretAccessKey'], 'SessionToken': c['SessionToken'],"
        " 'Expiration': soon.isoformat()}))\n"
    )
    config = tmp_path / "config"
    config.write_text(f"[profile rotating]\ncredential_process = {sys.executable} {script}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "rotating")
    lake = Lake(minio_settings_for(minio, f"refresh-{os.getpid()}", secret_key=None))
    first = lake.access.keys()
    lake.s3_client().list_objects_v2(Bucket=TEST_BUCKET, MaxKeys=1)
    second = lake.access.keys()
    assert first.access_key != second.access_key  # expired: the chain asked again
    from deltalake import write_deltalake

    write_deltalake(lake.uri("t"), pa.table({"a": [1, 2]}), storage_options=lake.storage_options)
    assert lake.open("t").version() == 0
    assert len(calls.read_text()) >= 3
    assert lake.access.describe_credentials().endswith("(custom-process)")
