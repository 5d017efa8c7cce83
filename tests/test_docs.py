"""The docs checker (tools.docs): broken links and stale generated parts are reported,
and the repository's own docs pass. Needs no server."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from tools import docs

ROOT = Path(__file__).resolve().parent.parent


def _write(root: Path, files: dict[str, str]) -> list[Path]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return [Path(name) for name in files if name.endswith(".md")]


def test_broken_links_and_anchors_are_reported_with_file_and_line(tmp_path: Path) -> None:
    files = _write(
        tmp_path,
        {
            "README.md": (
                "# Title\n\n"
                "[guide](docs/guide.md) and [its part](docs/guide.md#the-part-two)\n"
                "[missing](docs/nowhere.md)\n"
                "[bad anchor](docs/guide.md#no-such-heading)\n"
                "[web](https://example.com/x.md) [mail](mailto:a@b.c)\n"
                "`[in code](docs/nowhere.md)`\n"
                "```\n[in a block](docs/nowhere.md)\n```\n"
                "[self](#title) [self bad](#untitled)\n"
                "![image](docs/pic.png)\n"
            ),
            "docs/guide.md": (
                "# Guide\n\n## The `part`: two\n\n## Again\n\n## Again\n\n"
                "[up](../README.md#title) [dup](#again-1) [dir](../docs)\n"
            ),
            "docs/pic.png": "",
        },
    )
    problems = docs.link_problems(files, root=tmp_path)
    assert problems == [
        "README.md:4: broken link 'docs/nowhere.md': no such file",
        "README.md:5: broken link 'docs/guide.md#no-such-heading': "
        "docs/guide.md has no #no-such-heading",
        "README.md:11: broken link '#untitled': README.md has no #untitled",
    ]


def test_slugs_follow_github() -> None:
    assert docs.slug("Serving in PostgreSQL") == "serving-in-postgresql"
    assert docs.slug("Other writers' changes while the stream runs") == (
        "other-writers-changes-while-the-stream-runs"
    )
    assert docs.slug("Comparing layouts (`--layouts`)") == "comparing-layouts---layouts"
    assert docs.slug("Highest rate keeping up, by layout") == "highest-rate-keeping-up-by-layout"
    assert docs.anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


class _Settings(BaseSettings):
    """A settings class like deltabus' own."""

    model_config = SettingsConfigDict(env_prefix="APP_")

    # Where things go.
    where: str = "here"
    # How many, at most.
    count: int = Field(3, ge=1, le=9)
    token: SecretStr = Field(SecretStr("hunter2"), description="The API token.")


def test_settings_table_from_fields_and_comments_never_shows_a_secret() -> None:
    table = docs.settings_table(_Settings)
    assert "| `APP_WHERE` | string | `here` | Where things go. |" in table
    assert "| `APP_COUNT` | integer, 1 to 9 | `3` | How many, at most. |" in table
    assert "| `APP_TOKEN` | secret string | (secret, not shown) | The API token. |" in table
    assert "hunter2" not in table


def test_a_field_without_description_is_refused() -> None:
    class Bare(BaseSettings):
        undocumented: int = 1

    with pytest.raises(ValueError, match="undocumented"):
        docs.settings_table(Bare)


def test_a_config_table_that_differs_from_settings_is_reported(tmp_path: Path) -> None:
    current = docs.settings_table()
    stale = current.replace("`DELTABUS_BUCKET`", "`DELTABUS_BUCKET_NAME`")
    page = "# Configuration\n\n{}\n{}{}\n\nMore prose.\n"
    _write(tmp_path, {"c.md": page.format(docs.begin("settings"), stale, docs.END)})
    problems = docs.block_problems(Path("c.md"), "settings", current, root=tmp_path)
    assert len(problems) == 1
    assert problems[0].startswith("c.md:")
    assert "generated block 'settings' is out of date" in problems[0]

    fixed = docs.replace_block((tmp_path / "c.md").read_text(), "settings", current)
    assert fixed.endswith("\nMore prose.\n") and "DELTABUS_BUCKET_NAME" not in fixed
    (tmp_path / "c.md").write_text(fixed)
    assert docs.block_problems(Path("c.md"), "settings", current, root=tmp_path) == []

    _write(tmp_path, {"d.md": "# No markers\n"})
    assert (
        "no <!-- BEGIN generated: settings --> marker"
        in docs.block_problems(Path("d.md"), "settings", current, root=tmp_path)[0]
    )


def test_the_repository_docs_pass() -> None:
    """Links of README.md, CHANGELOG.md and docs/**, and the settings table. (The CLI
    reference, slower to generate, is checked by `make docs-check`, part of `make lint`.)"""
    assert docs.link_problems(docs.markdown_files()) == []
    assert docs.block_problems(docs.CONFIG_DOC, "settings", docs.settings_table()) == []


def test_a_decision_record_without_status_is_reported(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "docs/adr/0001-kept.md": "# 0001: Kept\n\nStatus: accepted, 2026-11-28.\n",
            "docs/adr/0002-unsaid.md": "# 0002: Unsaid\n\n## Context\n",
        },
    )
    assert docs.status_problems(tmp_path) == [
        "docs/adr/0002-unsaid.md:1: no `Status:` line (say accepted, superseded or proposed)"
    ]
