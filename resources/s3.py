"""The lake's store through `dagster_aws.s3.S3Resource`: bucket bootstrap and object listing.

Credentials are `EnvVar`s, so the UI shows variable names, never values. The engine's
names (DELTABUS_ACCESS_KEY / DELTABUS_SECRET_KEY) win; the MINIO_S3_ACCESS_KEY /
MINIO_S3_SECRET_ACCESS_KEY names of Pathway's example `.env` are used when only they are set.
With no secret-key variable, boto3 resolves the standard AWS chain, as the engine does.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from dagster import EnvVar
from dagster_aws.s3 import S3Resource
from pydantic import AliasChoices

from deltabus.core.settings import Settings


def _env_names(field: str) -> tuple[str, ...]:
    """The environment variables the engine's `Settings` reads `field` from, in order."""
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(c) for c in alias.choices if str(c).isupper())
    return (f"DELTABUS_{field.upper()}",)


def _default(field: str) -> str:
    return str(Settings.model_fields[field].default)


# Names and defaults come from the engine's Settings, so the two can never disagree.
ACCESS_KEY_VARS = _env_names("access_key")
SECRET_KEY_VARS = _env_names("secret_key")
ENDPOINT_VAR = _env_names("minio_endpoint")[0]
REGION_VAR = _env_names("region")[0]
TOKEN_VAR = _env_names("session_token")[0]
PROFILE_VAR = _env_names("profile")[0]
STORAGE_VAR = _env_names("storage")[0]
DEFAULT_ENDPOINT = _default("minio_endpoint")
DEFAULT_ACCESS_KEY = _default("access_key")


def _env_var(names: tuple[str, ...]) -> EnvVar | None:
    """`EnvVar` of the first of `names` that is set in this process, if any."""
    for name in names:
        if os.environ.get(name):
            return EnvVar(name)
    return None


def minio_s3_resource() -> S3Resource:
    """An `S3Resource` for the lake's store, configured from the environment.

    The endpoint falls back to the engine's default (none for DELTABUS_STORAGE=s3: AWS
    S3). With a secret-key variable the keys are static (with DELTABUS_SESSION_TOKEN when
    set); without one, boto3's standard AWS chain (AWS_* keys, AWS_PROFILE or
    DELTABUS_PROFILE, web identity, container or instance role) provides them.
    """
    endpoint: EnvVar | str | None = _env_var((ENDPOINT_VAR,))
    if endpoint is None and os.environ.get(STORAGE_VAR) != "s3":
        endpoint = DEFAULT_ENDPOINT
    secret = _env_var(SECRET_KEY_VARS)
    keys: dict[str, Any] = {}
    if secret is not None:
        keys = {
            "aws_access_key_id": _env_var(ACCESS_KEY_VARS) or DEFAULT_ACCESS_KEY,
            "aws_secret_access_key": secret,
            "aws_session_token": _env_var((TOKEN_VAR,)),
        }
    else:
        keys = {"profile_name": _env_var((PROFILE_VAR,))}
    return S3Resource(
        endpoint_url=endpoint,
        region_name=_env_var((REGION_VAR,)),
        use_ssl=not os.environ.get(ENDPOINT_VAR, DEFAULT_ENDPOINT).startswith("http://"),
        max_attempts=3,
        **keys,
    )


def ensure_bucket(client: Any, bucket: str) -> bool:
    """Create `bucket` when it does not exist; returns True when it was created."""
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
        return False
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 404 and exc.response.get("Error", {}).get("Code") not in (
            "404",
            "NoSuchBucket",
        ):
            raise
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in (
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        ):
            raise
        return False
    return True


def list_table_objects(client: Any, bucket: str, prefix: str) -> dict[str, dict[str, int]]:
    """Objects and bytes per table directory under `prefix` (data files and Delta log)."""
    root = prefix.strip("/") + "/" if prefix.strip("/") else ""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"objects": 0, "bytes": 0})
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=root):
        for obj in page.get("Contents", []):
            table = obj["Key"][len(root) :].split("/", 1)[0]
            totals[table]["objects"] += 1
            totals[table]["bytes"] += int(obj["Size"])
    return dict(totals)
