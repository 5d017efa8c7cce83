"""`pip install deltabus` is the bus alone.

The wheel holds the `deltabus` package only. Installed with no extra into a fresh
virtualenv (at the versions of uv.lock), its command line creates a stream, produces to it
and consumes it on a real MinIO; `import deltabus` loads no extra (none is installed),
`deltabus --version` prints the version and a command of an extra exits 2 naming it. The
install needs the package registry (or uv's cache, ~/.cache/uv).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from deltabus.core.extras import EXTRA_MODULES
from deltabus.core.processes import child_env
from deltabus.core.version import __version__
from deltabus.delta.lake import Lake
from tests.conftest import IN_CI

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Variables that would let the fresh interpreter import the repository's sources.
NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "UV_PROJECT")


def uv() -> list[str]:
    """The uv command; a missing uv fails in CI and skips elsewhere."""
    found = shutil.which("uv")
    if found:
        return [found]
    python3 = shutil.which("python3")
    if (
        python3
        and subprocess.run([python3, "-m", "uv", "--version"], capture_output=True).returncode == 0
    ):
        return [python3, "-m", "uv"]
    if IN_CI:
        pytest.fail("uv is required in CI: `make venv` installs it (python3 -m pip install uv)")
    pytest.skip("no uv (make venv installs it)")


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("timeout", 600)
    return subprocess.run(args, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    size_mb: int

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this environment) for a process of the fresh virtualenv."""
        env = {k: v for k, v in (base or os.environ).items() if k not in NOT_INHERITED}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The wheel, built from this tree, installed with no extra into a fresh virtualenv,
    constrained to the versions of uv.lock."""
    tmp = tmp_path_factory.mktemp("install")
    started = time.monotonic()
    built = run([*uv(), "build", "--wheel", "--out-dir", str(tmp / "dist")], cwd=REPO)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("deltabus-*.whl")
    exported = run(
        [
            *uv(),
            "export",
            "--frozen",
            "--no-hashes",
            "--no-dev",
            "--all-extras",
            "--no-emit-project",
            "--output-file",
            str(tmp / "constraints.txt"),
        ],
        cwd=REPO,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    venv = tmp / "venv"
    made = run([*uv(), "venv", "--python", "3.11", str(venv)], cwd=tmp)
    assert made.returncode == 0, made.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    install = [*uv(), "pip", "install", "--python", str(venv / "bin" / "python")]
    added = run([*install, "-c", str(tmp / "constraints.txt"), str(wheel)], cwd=tmp, env=env)
    assert added.returncode == 0, added.stderr[-3000:]
    du = run(["du", "-sm", str(venv)])
    size_mb = int(du.stdout.split()[0])
    print(
        f"\nfresh virtualenv with the wheel and no extra: {size_mb} MB (du -sm {venv}); "
        f"built and installed in {time.monotonic() - started:.1f} s"
    )
    yield Installed(wheel, venv, size_mb)


def test_the_wheel_ships_only_the_deltabus_package(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    tops = {n.split("/")[0] for n in names}
    assert tops == {"deltabus", f"deltabus-{__version__}.dist-info"}, sorted(tops)
    assert "deltabus/cli/main.py" in names
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    base = {re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in requires if "extra ==" not in r}
    assert "pathway" not in base and not any(name.startswith("dagster") for name in base)


def test_the_bus_commands_run_without_extras(
    installed: Installed, minio_lake: Lake, tmp_path: Path
) -> None:
    env = installed.env(child_env(minio_lake.settings))
    deltabus = str(installed.bin / "deltabus")

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return run([deltabus, *args], env=env, cwd=tmp_path, input=stdin, timeout=180)

    assert cli("--help").returncode == 0
    created = cli(
        "streams", "create", "orders", "--schema", "order_id:int64!,customer:string",
        "--partitions", "2", "--key", "customer",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert cli("streams", "list").stdout.split() == ["orders"]
    records = [{"order_id": i, "customer": f"c{i % 5}"} for i in range(200)]
    produced = cli(
        "produce", "--stream", "orders", "--producer-id", "install-1",
        stdin="".join(json.dumps(r) + "\n" for r in records),
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    consumed = cli("consume", "--stream", "orders", "--group", "billing", "--idle-exit-s", "3")
    assert consumed.returncode == 0, consumed.stderr
    rows = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(r["order_id"] for r in rows) == list(range(200))
    assert {r["_stream"] for r in rows} == {"orders"} and {r["diff"] for r in rows} == {1}
    described = cli("--json", "groups", "describe", "billing")
    assert described.returncode == 0, described.stderr
    assert all(p["lag"] == 0 for p in json.loads(described.stdout)["partitions"].values())


def test_import_loads_no_extra_and_none_is_installed(installed: Installed, tmp_path: Path) -> None:
    extras = sorted(set().union(*EXTRA_MODULES.values()) - {"rich"})  # rich: typer needs it
    probe = f"""
import importlib.util, json, sys
import deltabus
import deltabus.cli
print(json.dumps({{
    "file": deltabus.__file__,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in {extras!r} + ["pandas"]),
    "installed": sorted(m for m in {extras!r} + ["pandas"] if importlib.util.find_spec(m)),
}}))
"""
    result = run([str(installed.bin / "python"), "-c", probe], env=installed.env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert Path(found["file"]).is_relative_to(installed.venv), found["file"]
    assert found["loaded"] == [] and found["installed"] == [], found


def test_version_is_the_installed_one(installed: Installed, tmp_path: Path) -> None:
    version = PYPROJECT["project"]["version"]
    assert __version__ == version  # the version written into commits is the package's
    result = run([str(installed.bin / "deltabus"), "--version"], env=installed.env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"deltabus {version}"


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["etl"], "pathway"),
        (["produce", "--count", "10"], "pathway"),
        (["results"], "pathway"),
        (["serve", "postgres", "--once", "--dsn", "postgresql://u@127.0.0.1:1/db"], "serve"),
    ],
)
def test_a_command_of_a_missing_extra_names_it(
    installed: Installed, minio_lake: Lake, tmp_path: Path, args: list[str], extra: str
) -> None:
    env = installed.env(child_env(minio_lake.settings))
    result = run([str(installed.bin / "deltabus"), *args], env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    command = " ".join(["deltabus", *args[: 2 if args[0] == "serve" else 1]])
    assert f"{command}" in lines[0]
    assert f"needs the {extra} extra: pip install 'deltabus[{extra}]'" in lines[0]


def test_the_wheel_has_no_benchmark_and_says_where_it_is(
    installed: Installed, tmp_path: Path
) -> None:
    """The benchmark stays in the repository: the wheel's `deltabus bench` names where."""
    probe = "import importlib.util; print(importlib.util.find_spec('deltabus_bench') is None)"
    found = run([str(installed.bin / "python"), "-c", probe], env=installed.env(), cwd=tmp_path)
    assert found.stdout.strip() == "True", found.stdout + found.stderr
    for command in ("bench", "store-check"):
        result = run(
            [str(installed.bin / "deltabus"), command, "--rates", "1000"],
            env=installed.env(),
            cwd=tmp_path,
        )
        assert result.returncode == 2, result.stdout + result.stderr
        problem, fix = result.stderr.strip().splitlines()  # the error, then how to fix it
        assert "deltabus_bench" in problem and "not installed" in problem, result.stderr
        assert fix.strip().startswith("fix:"), result.stderr
        assert "checkout of the deltabus repository" in fix, result.stderr


def _names(requirements: list[str]) -> tuple[set[str], set[str]]:
    """(distribution names, extras of deltabus itself) in `requirements`."""
    names, own = set(), set()
    for requirement in requirements:
        name = re.split(r"[<>=!~ ;\[]", requirement)[0].lower().replace("_", "-")
        if name == "deltabus":
            own.update(re.search(r"\[(.*)\]", requirement).group(1).split(","))  # type: ignore[union-attr]
        else:
            names.add(name)
    return names, own


def test_the_extras_modules_match_pyproject() -> None:
    """deltabus.core.extras names, for each extra, the modules of exactly the distributions
    pyproject.toml lists in it (with the extras it includes)."""
    optional = PYPROJECT["project"]["optional-dependencies"]
    distributions = {
        module: {d.lower().replace("_", "-") for d in dists}
        for module, dists in packages_distributions().items()
    }

    def expanded(extra: str) -> set[str]:
        names, own = _names(optional[extra])
        return names.union(*(expanded(e) for e in own))

    assert set(EXTRA_MODULES) == set(optional) - {"dev"}
    for extra, modules in EXTRA_MODULES.items():
        listed = expanded(extra)
        provided = set().union(*(distributions.get(m, set()) for m in modules))
        assert all(distributions.get(m, set()) & listed for m in modules), extra
        assert listed <= provided, (extra, listed - provided)
