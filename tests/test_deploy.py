"""The Helm chart (deploy/helm/deltabus) and the images it runs, checked offline.

The chart is rendered with the pinned Helm (platform/deploy-check.sh builds it with `go
install` and caches it) and the manifests are read as Kubernetes reads them: every bus
Deployment has its probes on the health port, runs as a non-root user with a read-only
root filesystem, takes secrets only by reference; the ETL shares partitions by lease;
a Deployment of more than one replica has a PodDisruptionBudget; invalid values are
refused. The Dockerfiles are parsed, since no image can be built here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "deltabus"
ALL_ON = CHART / "ci" / "all-on-values.yaml"
IN_CI = os.environ.get("CI", "").lower() == "true"
BUS_COMPONENTS = {"producer", "etl", "sink-postgres", "sink-opensearch"}
# Variables whose value is a secret: only ever a reference to a Secret.
SECRET_VARIABLES = {
    "DELTABUS_SECRET_KEY",
    "DELTABUS_SESSION_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "DELTABUS_POSTGRES_DSN",
    "DELTABUS_OPENSEARCH_URL",
}


@pytest.fixture(scope="module")
def helm() -> str:
    """The pinned Helm from the cache, built with `go install` when missing; a missing Helm
    with no Go to build it is a skip here and a failure in CI."""
    script = REPO / "platform" / "deploy-check.sh"
    version = re.search(r"HELM_VERSION:-(v[0-9.]+)", script.read_text()).group(1)
    cache = Path(os.environ.get("DELTABUS_CACHE", Path.home() / ".cache" / "deltabus"))
    if shutil.which("go") is None and not (cache / f"helm-{version}" / "helm").is_file():
        if IN_CI:
            pytest.fail("Helm is required in CI: run `make deploy-check` (go install) first")
        pytest.skip("no Helm in the cache and no Go to build it: run `make deploy-check`")
    built = subprocess.run(
        ["bash", str(script), "helm-bin"], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, f"Helm is not usable: {built.stderr[-2000:]}"
    return built.stdout.strip().splitlines()[-1]


def render(helm: str, *values: Path, **settings: Any) -> list[dict[str, Any]]:
    """The chart's manifests for release `rel` in namespace `ns`; `settings` as --set-json."""
    args = [helm, "template", "rel", str(CHART), "--namespace", "ns"]
    for path in values:
        args += ["--values", str(path)]
    for key, value in settings.items():
        args += ["--set-json", f"{key.replace('__', '.')}={json.dumps(value)}"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def component(doc: dict[str, Any]) -> str:
    return doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def env_of(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(deployment).get("env", [])}


@pytest.fixture(scope="module")
def all_on(helm: str) -> list[dict[str, Any]]:
    return render(helm, ALL_ON)


def test_every_bus_deployment_is_probed_on_its_health_port(all_on: list[dict[str, Any]]):
    deployments = of_kind(all_on, "Deployment")
    bus = {component(d): d for d in deployments.values() if component(d) in BUS_COMPONENTS}
    assert set(bus) == BUS_COMPONENTS
    for name, deployment in bus.items():
        c = container(deployment)
        (port,) = [p for p in c["ports"] if p["name"] == "health"]
        assert env_of(deployment)["DELTABUS_HEALTH_PORT"]["value"] == str(port["containerPort"])
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}, name
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}, name
        assert c["startupProbe"]["httpGet"]["port"] == "health", name
        assert c["args"][0] in ("produce", "etl", "serve"), name


def test_every_pod_runs_unprivileged_on_a_read_only_root(all_on: list[dict[str, Any]]):
    for name, deployment in of_kind(all_on, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["automountServiceAccountToken"] is False, name
        security = container(deployment)["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], name
        assert "requests" in container(deployment)["resources"], name
        assert "limits" in container(deployment)["resources"], name


def test_secrets_are_only_referenced(all_on: list[dict[str, Any]]):
    assert not of_kind(all_on, "Secret"), "the chart must never create a Secret"
    for name, deployment in of_kind(all_on, "Deployment").items():
        for variable, entry in env_of(deployment).items():
            if variable in SECRET_VARIABLES:
                assert "value" not in entry, f"{name}: {variable} is inline"
                assert entry["valueFrom"]["secretKeyRef"]["name"], name
    (config,) = of_kind(all_on, "ConfigMap").values()
    assert not SECRET_VARIABLES & set(config["data"]), config["data"]
    sinks = {component(d): env_of(d) for d in of_kind(all_on, "Deployment").values()}
    dsn = sinks["sink-postgres"]["DELTABUS_POSTGRES_DSN"]["valueFrom"]["secretKeyRef"]
    assert dsn == {"name": "serving-postgres", "key": "dsn"}
    key = sinks["etl"]["DELTABUS_SECRET_KEY"]["valueFrom"]["secretKeyRef"]
    assert key == {"name": "lake-keys", "key": "secret-key"}


def test_the_etl_shares_partitions_by_lease_and_producers_need_no_identity(
    all_on: list[dict[str, Any]],
) -> None:
    by_component = {component(d): d for d in of_kind(all_on, "Deployment").values()}
    etl = container(by_component["etl"])["args"]
    assert etl[:4] == ["etl", "--mode", "continuous", "--lease"]
    assert "--process" not in etl and "--processes" not in etl
    assert by_component["etl"]["spec"]["replicas"] == 3
    producer = by_component["producer"]
    args = container(producer)["args"]
    assert args[args.index("--run-id") + 1] == "$(POD_NAME)"
    assert args[args.index("--duration") + 1] == "31536000"  # not 3.1536e+07
    pod_name = env_of(producer)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert pod_name == "metadata.name"
    for name in ("producer", "sink-postgres", "sink-opensearch", "etl"):
        assert by_component[name]["kind"] == "Deployment"  # no StatefulSet identities
    follow_components = ("sink-postgres", "sink-opensearch")
    follow = [container(by_component[s])["args"][:3] for s in follow_components]
    assert follow == [["serve", "postgres", "--follow"], ["serve", "opensearch", "--follow"]]
    postgres, opensearch = (container(by_component[s])["args"] for s in follow_components)
    assert "--lease" in postgres and "--lease-ttl-s" not in postgres  # the command's default
    assert opensearch[opensearch.index("--lease") :][:3] == ["--lease", "--lease-ttl-s", "15"]
    assert by_component["sink-opensearch"]["spec"]["replicas"] == 2  # active and standby


def test_a_disruption_budget_for_each_deployment_of_several_replicas(
    helm: str, all_on: list[dict[str, Any]]
) -> None:
    deployments = of_kind(all_on, "Deployment")
    budgets = of_kind(all_on, "PodDisruptionBudget")
    several = {
        name
        for name, d in deployments.items()
        if component(d) in BUS_COMPONENTS and d["spec"]["replicas"] > 1
    }
    assert (
        several
        == set(budgets)
        == {"rel-deltabus-producer", "rel-deltabus-etl", "rel-deltabus-sink-opensearch"}
    )
    for name, budget in budgets.items():
        pods = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= pods.items()
    single = render(helm, etl__replicas=1)
    assert not of_kind(single, "PodDisruptionBudget")
    off = render(helm, ALL_ON, podDisruptionBudget__enabled=False)
    assert not of_kind(off, "PodDisruptionBudget")


def test_credentials_by_irsa_or_secret(helm: str) -> None:
    irsa = render(
        helm,
        credentials__existingSecret="",
        serviceAccount__roleArn="arn:aws:iam::123456789012:role/deltabus",
    )
    (account,) = of_kind(irsa, "ServiceAccount").values()
    role = account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert role == "arn:aws:iam::123456789012:role/deltabus"
    (etl,) = of_kind(irsa, "Deployment").values()
    assert etl["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert not {"DELTABUS_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"} & set(env_of(etl))
    aws = render(
        helm,
        credentials__existingSecret="aws-keys",
        credentials__keys={"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"},
    )
    (etl,) = of_kind(aws, "Deployment").values()
    ref = env_of(etl)["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "aws-keys", "key": "secret"}


def test_the_dagster_code_location_serves_grpc_for_the_k8s_run_launcher(
    all_on: list[dict[str, Any]],
) -> None:
    deployment = of_kind(all_on, "Deployment")["rel-deltabus-dagster"]
    c = container(deployment)
    assert c["command"][:3] == ["dagster", "api", "grpc"]
    assert c["command"][c["command"].index("--port") + 1] == "3030"
    assert (
        c["command"][c["command"].index("--python-file") + 1] == "/opt/dagster/app/definitions.py"
    )
    assert c["workingDir"] == "/opt/dagster/app"
    env = env_of(deployment)
    assert env["DAGSTER_CURRENT_IMAGE"]["value"] == c["image"]
    context = json.loads(env["DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT"]["value"])["k8s"]
    assert context["env_config_maps"] == ["rel-deltabus-lake"]
    assert context["service_account_name"] == "rel-deltabus"
    assert context["namespace"] == "ns"
    assert {
        "name": "DELTABUS_SECRET_KEY",
        "valueFrom": {"secretKeyRef": {"name": "lake-keys", "key": "secret-key"}},
    } in context["env"]
    (service,) = of_kind(all_on, "Service").values()
    assert service["metadata"]["name"] == "rel-deltabus-dagster"
    assert service["spec"]["ports"] == [
        {"name": "grpc", "port": 3030, "targetPort": "grpc", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def lint(helm: str, tmp_path: Path, values: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "values.yaml"
    path.write_text(values)
    return subprocess.run(
        [helm, "lint", "--strict", str(CHART), "--values", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ("etl:\n  replicas: two\n", "/etl/replicas"),
        ("etl:\n  replica: 2\n", "replica"),  # a misspelt key
        ("sinks:\n  postgres:\n    enabled: true\n", "/sinks/postgres/dsnSecret/name"),
        ("podSecurityContext:\n  runAsNonRoot: false\n", "/podSecurityContext/runAsNonRoot"),
        ("lake:\n  storage: local\n", "/lake/storage"),
        ("credentials:\n  keys:\n    SECRET_KEY: k\n", "SECRET_KEY"),
    ],
)
def test_invalid_values_are_refused(helm: str, tmp_path: Path, values: str, complaint: str) -> None:
    result = lint(helm, tmp_path, values)
    assert result.returncode != 0, result.stdout
    assert complaint in result.stdout + result.stderr


def test_the_default_and_all_on_values_lint_clean(helm: str, tmp_path: Path) -> None:
    assert lint(helm, tmp_path, "{}\n").returncode == 0
    assert lint(helm, tmp_path, ALL_ON.read_text()).returncode == 0


# -- the images ---------------------------------------------------------------------------


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current += " " + line.removesuffix("\\").strip() if current else line.removesuffix("\\")
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for instruction in instructions(dockerfile):
        if instruction[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(instruction)
    return out


def test_the_bus_image_is_multi_stage_locked_and_unprivileged() -> None:
    dockerfile = REPO / "platform" / "bus.Dockerfile"
    builder, runtime = stages(dockerfile)
    assert builder[0][1].endswith(" AS builder")
    syncs = [args for op, args in builder if op == "RUN" and "uv sync" in args]
    assert syncs and all("--frozen" in s and "--no-editable" in s for s in syncs)
    assert all("--extra pathway" in s and "--extra serve" in s for s in syncs)
    assert not any("dagster" in s for s in syncs)
    copies = [args for op, args in builder if op == "COPY"]
    assert "pyproject.toml uv.lock ./" in copies
    runtime_ops = dict(runtime)
    assert "--from=builder /app/.venv /app/.venv" in [a for op, a in runtime if op == "COPY"]
    assert not [a for op, a in runtime if op == "RUN" and "uv " in a]  # no install at runtime
    user = runtime_ops["USER"].split(":")[0]
    assert user.isdigit() and int(user) > 0
    assert json.loads(runtime_ops["ENTRYPOINT"]) == ["deltabus"]
    assert json.loads(runtime_ops["CMD"]) == ["--help"]
    text = dockerfile.read_text()
    assert not re.search(r"(?i)(secret|password|token)[A-Z_]*\s*=", text), "a secret is baked in"


def test_the_dagster_image_runs_as_a_numeric_non_root_user() -> None:
    ops = instructions(REPO / "platform" / "Dockerfile")
    (user,) = [args for op, args in ops if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0  # Kubernetes checks runAsNonRoot only on a number
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["dagster"]["runAsUser"] == int(uid)
    assert values["podSecurityContext"]["runAsUser"] == 10001  # bus.Dockerfile's USER
    syncs = [args for op, args in ops if op == "RUN" and "uv sync" in args]
    assert syncs and all("--frozen" in s for s in syncs)


def test_dockerignore_keeps_secrets_out_of_both_images() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".env" in ignored
