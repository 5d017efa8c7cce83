"""`deltabus bench --workload FILE`: workloads as data.

Every file in workloads/ names only options the command has; a file's values become the
command's defaults and the command line still wins; a bad file is one clear error before
any run starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from deltabus.cli import app
from deltabus.core.errors import ConfigError
from deltabus_bench.config import parse_rates
from deltabus_bench.workload_file import load_workload
from tests.conftest import run_cli

WORKLOADS = sorted((Path(__file__).parent.parent / "workloads").glob("*.yaml"))


def _bench_options() -> dict:
    command = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.name != "workload"}


def test_the_repository_has_workloads() -> None:
    names = {p.stem for p in WORKLOADS}
    assert {"store-s3-standard", "soak-2h", "sweep-100ms", "etl-spark-100ms"} <= names


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_every_workload_names_known_options(path: Path) -> None:
    values = load_workload(path, _bench_options())
    assert parse_rates(values["rates"])  # every workload says its rates
    assert str(values["out"]).startswith("bench-out/")  # reports never land in the tree
    assert "description" not in values


def test_lists_become_the_command_lines_comma_form(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("description: x\nrates: [10000, 30k]\nlocal-minio: true\n--store: s3-express\n")
    values = load_workload(path, _bench_options())
    assert values == {"rates": "10000,30k", "local_minio": True, "store": "s3-express"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("rates: [1000]\nrate-limit: 5\n", "unknown option\\(s\\): rate-limit"),
        ("- rates\n- 1000\n", "must be a mapping"),
        ("rates: [1000\n", "not valid YAML"),
    ],
)
def test_a_bad_file_is_refused(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_workload(path, _bench_options())
    with pytest.raises(ConfigError, match="cannot read the workload file"):
        load_workload(tmp_path / "missing.yaml", _bench_options())


def _refused(tmp_path: Path, text: str, *args: str) -> str:
    """stderr of `deltabus bench --workload` with this file, which must fail with exit 2
    before any run (no --out folder)."""
    path = tmp_path / "w.yaml"
    path.write_text(text + f"out: {tmp_path / 'out'}\n")
    result = run_cli(["bench", "--workload", str(path), *args], {}, tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert not (tmp_path / "out").exists()
    return result.stderr


def test_the_file_sets_the_options_and_the_command_line_wins(tmp_path: Path) -> None:
    # The file's serve reaches the command: refused as the command line's would be.
    assert "postgres, opensearch" in _refused(tmp_path, "rates: [1000]\nserve: mysql\n")
    # Its bad rates are overridden by --rates, so the error is about serve, not the rates.
    stderr = _refused(tmp_path, "rates: [lots]\n", "--rates", "1000", "--serve", "mysql")
    assert "postgres, opensearch" in stderr and "lots" not in stderr


def test_an_unknown_option_in_the_file_is_one_clear_error(tmp_path: Path) -> None:
    stderr = _refused(tmp_path, "rates: [1000]\nrate_limit: 5\n")
    assert "unknown option(s): rate_limit" in stderr and "Traceback" not in stderr
