"""Generate and check the documentation.

    python -m tools.docs generate   # rewrite the generated parts of the docs
    python -m tools.docs check      # exit 1, listing file:line: problem, when the docs are wrong

Generated parts, each between `<!-- BEGIN generated: NAME -->` and `<!-- END generated -->`:

- `settings` in docs/guide/configuration.md: one row per field of `deltabus.core.settings.Settings`
  (variable, type, default, description). A description is the field's `description`, else
  the comment block right above the field in deltabus/core/settings.py. A secret's default is
  never printed.
- `cli` in docs/reference/cli.md: `deltabus --help` and the `--help` of every subcommand,
  run with COLUMNS=100 and NO_COLOR=1.

`check` reports (1) relative links in the Markdown files of the repository (README.md,
CHANGELOG.md, docs/**) to a missing file, or to a missing #anchor of a Markdown file
(GitHub's heading slugs); http(s) and mailto links are not followed; (2) a generated part
that differs from what `generate` writes now; (3) a decision record (docs/adr/NNNN-*.md)
without a `Status:` line.

The deltabus package never imports this module.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import os
import re
import subprocess
import sys
import tokenize
import typing
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DOC = Path("docs/guide/configuration.md")
CLI_DOC = Path("docs/reference/cli.md")
API_DOC = Path("docs/reference/api.md")
END = "<!-- END generated -->"
HELP_ENV = {"COLUMNS": "100", "NO_COLOR": "1", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def begin(name: str) -> str:
    return f"<!-- BEGIN generated: {name} -->"


# -- the settings table -----------------------------------------------------------------


def _comments_above_fields(source: str, class_name: str) -> dict[str, str]:
    """Field name -> the `#` comment lines right above its assignment in the class body."""
    tree = ast.parse(source)
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].strip().startswith("#"):
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                block, line = [], stmt.lineno - 1
                while line in comments:
                    block.insert(0, comments[line])
                    line -= 1
                if block:
                    found[stmt.target.id] = " ".join(block)
    return found


def _type_name(annotation: object) -> str:
    from pydantic import SecretStr

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(f"`{a}`" for a in typing.get_args(annotation))
    if args and len(args) < len(typing.get_args(annotation)):  # X | None
        return _type_name(args[0]) if len(args) == 1 else " or ".join(map(_type_name, args))
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    if annotation is SecretStr:
        return "secret string"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bounds(field: object) -> str:
    ge = le = None
    for item in getattr(field, "metadata", ()):
        ge = getattr(item, "ge", ge)
        le = getattr(item, "le", le)
    fmt = "{:g}".format
    if ge is not None and le is not None:
        return f", {fmt(ge)} to {fmt(le)}"
    if ge is not None:
        return f", ≥ {fmt(ge)}"
    if le is not None:
        return f", ≤ {fmt(le)}"
    return ""


def _default(field: object, secret: bool) -> str:
    value = getattr(field, "default", None)
    if value is None:
        return "unset"
    if secret:
        return "(secret, not shown)"
    if isinstance(value, bool):
        return f"`{'true' if value else 'false'}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _variables(name: str, field: object, prefix: str) -> str:
    from pydantic import AliasChoices

    alias = getattr(field, "validation_alias", None)
    if isinstance(alias, AliasChoices):
        names = [c for c in alias.choices if isinstance(c, str) and c.isupper()]
    elif isinstance(alias, str):
        names = [alias]
    else:
        names = [f"{prefix}{name}".upper()]
    return " or ".join(f"`{n}`" for n in names)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_table(settings_cls: type | None = None, source: str | None = None) -> str:
    """The Markdown table of a pydantic-settings class (by default deltabus' Settings).

    Raises ValueError naming each field that has no description anywhere.
    """
    from pydantic import SecretStr

    if settings_cls is None:
        from deltabus.core.settings import Settings as settings_cls  # noqa: N813
    if source is None:
        import inspect

        source = inspect.getsource(sys.modules[settings_cls.__module__])
    comments = _comments_above_fields(source, settings_cls.__name__)
    prefix = settings_cls.model_config.get("env_prefix", "")
    rows = ["| variable | type | default | description |", "|---|---|---|---|"]
    missing = []
    for name, field in settings_cls.model_fields.items():
        secret = SecretStr in (field.annotation, *typing.get_args(field.annotation))
        text = field.description or comments.get(name)
        if not text:
            missing.append(name)
            continue
        kind = _type_name(field.annotation) + _bounds(field)
        cells = [_variables(name, field, prefix), kind, _default(field, secret), text]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if missing:
        raise ValueError(
            "Settings fields without a description (give Field(description=...) or a "
            "comment above the field): " + ", ".join(missing)
        )
    return "\n".join(rows) + "\n"


def serving_settings_table() -> str:
    """The Markdown table of the serving sinks' settings."""
    from deltabus.adapters.serving.settings import ServingSettings

    return settings_table(ServingSettings)


# -- the CLI reference -------------------------------------------------------------------


def command_paths() -> list[tuple[str, ...]]:
    """Every command of `deltabus`, as argument paths, in the order `--help` lists them."""
    import typer

    from deltabus.cli import app

    paths: list[tuple[str, ...]] = []

    def walk(command: typing.Any, path: tuple[str, ...], parent: typing.Any) -> None:
        ctx = command.context_class(command, parent=parent, info_name=path[-1] if path else "")
        paths.append(path)
        if hasattr(command, "list_commands"):  # a group (typer bundles its own click)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, (*path, name), ctx)

    walk(typer.main.get_command(app), (), None)
    return paths


def deltabus_executable() -> str:
    beside = Path(sys.executable).parent / "deltabus"
    return str(beside) if beside.exists() else "deltabus"


def help_text(path: tuple[str, ...]) -> str:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "SYSTEMROOT")}
    env.update(HELP_ENV)
    done = subprocess.run(
        [deltabus_executable(), *path, "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"deltabus {' '.join(path)} --help failed: {done.stderr.strip()}")
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def cli_reference() -> str:
    parts = []
    for path in command_paths():
        title = " ".join(("deltabus", *path))
        level = "##" if len(path) <= 1 else "###"
        parts.append(f"{level} `{title}`\n\n```text\n{help_text(path)}\n```\n")
    return "\n".join(parts)


# -- the Python API reference -------------------------------------------------------------

# Modules whose public names the reference lists, beside `deltabus` itself.
API_MODULES = ("deltabus.errors",)


def _doc(obj: object) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "(no docstring)"


class _Written:
    """An annotation as written in the source (`from __future__ import annotations` keeps
    them as strings), shown without quotes."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(obj: object) -> str:
    """`obj`'s signature as written, without `self`."""
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"

    def written(annotation: object) -> object:
        return _Written(annotation) if isinstance(annotation, str) else annotation

    params = [
        p.replace(annotation=written(p.annotation))
        for p in sig.parameters.values()
        if p.name != "self"
    ]
    return str(sig.replace(parameters=params, return_annotation=written(sig.return_annotation)))


def _members(cls: type) -> list[tuple[str, object]]:
    """The public methods and properties `cls` itself defines, in source order."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__call__", "__iter__"):
            continue
        if name == "__init__":
            continue  # its signature heads the class
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member) or isinstance(member, property):
            out.append((name, member))
    return out


def _entry(qualified: str, obj: object) -> str:
    """One name of the public API: its signature, its docstring and, for a class, the
    methods and properties it defines."""
    if inspect.isclass(obj):
        signature = _signature(obj).removesuffix(" -> None")
        parts = [f"### `{qualified}`", "", "```python", f"class {obj.__name__}{signature}"]
        parts += ["```", "", _doc(obj), ""]
        for name, member in _members(obj):
            if isinstance(member, property):
                parts += [f"#### `{obj.__name__}.{name}` (property)", "", _doc(member), ""]
            else:
                parts += [f"#### `{obj.__name__}.{name}{_signature(member)}`", ""]
                parts += [_doc(member), ""]
        return "\n".join(parts)
    if callable(obj):
        return f"### `{qualified}{_signature(obj)}`\n\n{_doc(obj)}\n"
    return f"### `{qualified}`\n\n`{obj!r}`\n"


def api_reference() -> str:
    """Every name `deltabus` exports (its errors listed once, with `retriable`), from the
    code's own signatures and docstrings."""
    import importlib

    import deltabus

    errors = importlib.import_module("deltabus.errors")
    error_names = set(errors.__all__)
    parts = ["## `deltabus`", "", _doc(deltabus), ""]
    for name in deltabus.__all__:
        if name not in error_names:
            parts.append(_entry(f"deltabus.{name}", getattr(deltabus, name)))
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        parts += [f"## `{module_name}`", "", _doc(module), ""]
        parts += ["| exception | base | retriable |", "|---|---|---|"]
        for name in module.__all__:
            cls = getattr(module, name)
            retriable = getattr(cls, "retriable", None)
            shown = "—" if retriable is None else ("yes" if retriable else "no")
            parts.append(f"| `{name}` | `{cls.__mro__[1].__name__}` | {shown} |")
        parts.append("")
        for name in module.__all__:
            cls = getattr(module, name)
            parts += [f"### `{module_name}.{name}`", "", _doc(cls), ""]
    return "\n".join(parts)


# -- generated blocks --------------------------------------------------------------------


def replace_block(text: str, name: str, body: str) -> str:
    start = text.find(begin(name))
    if start < 0:
        raise ValueError(f"no {begin(name)} marker")
    head = start + len(begin(name))
    stop = text.find(END, head)
    if stop < 0:
        raise ValueError(f"{begin(name)} has no {END}")
    return text[:head] + "\n" + body.rstrip("\n") + "\n" + text[stop:]


def block_problems(path: Path, name: str, body: str, root: Path = ROOT) -> list[str]:
    """A generated block that differs from `body`, as `file:line: message` problems."""
    rel = path.relative_to(root) if path.is_absolute() else path
    full = root / rel
    if not full.exists():
        return [f"{rel}:1: missing; run `make docs`"]
    text = full.read_text(encoding="utf-8")
    try:
        wanted = replace_block(text, name, body)
    except ValueError as exc:
        return [f"{rel}:1: {exc}"]
    if wanted == text:
        return []
    line = 1
    for number, (have, want) in enumerate(
        zip(text.splitlines(), wanted.splitlines(), strict=False), 1
    ):
        if have != want:
            line = number
            break
    else:
        line = min(len(text.splitlines()), len(wanted.splitlines())) + 1
    return [f"{rel}:{line}: generated block '{name}' is out of date; run `make docs`"]


# -- links -------------------------------------------------------------------------------

FENCE = re.compile(r"^\s*(```+|~~~+)")
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"  # [text], one level of nested brackets
    r"\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)"  # (target "title")
)
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
SKIP_SCHEMES = ("http://", "https://", "mailto:", "ftp://")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            mark = match.group(1)[0] * 3
            if fence is None:
                fence = mark
            elif mark == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading text (before duplicates get -1, -2, ...)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # punctuation, `, *, ...; letters stay
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code blocks and code spans."""
    out = []
    for number, line in _prose_lines(text):
        prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        ref = REF_DEF.match(prose)
        if ref:
            out.append((number, ref.group(1)))
            continue
        for match in INLINE_LINK.finditer(prose):
            out.append((number, match.group(1)))
    return out


def link_problems(files: list[Path], root: Path = ROOT) -> list[str]:
    """Broken relative links in `files` (paths relative to `root`)."""
    problems = []
    cache: dict[Path, set[str]] = {}

    def anchors_of(path: Path) -> set[str]:
        if path not in cache:
            cache[path] = anchors(path.read_text(encoding="utf-8"))
        return cache[path]

    for rel in files:
        source = root / rel
        for number, target in links(source.read_text(encoding="utf-8")):
            target = target.strip("<>")
            if target.lower().startswith(SKIP_SCHEMES) or not target:
                continue
            where, _, anchor = target.partition("#")
            where = unquote(where.split("?", 1)[0])
            if where.startswith("/"):
                dest = root / where.lstrip("/")
            elif where:
                dest = source.parent / where
            else:
                dest = source
            if not dest.exists():
                problems.append(f"{rel}:{number}: broken link {target!r}: no such file")
                continue
            if anchor and dest.is_file() and dest.suffix.lower() == ".md":
                if unquote(anchor).lower() not in anchors_of(dest.resolve()):
                    shown = dest.resolve().relative_to(root.resolve())
                    problems.append(
                        f"{rel}:{number}: broken link {target!r}: {shown} has no #{anchor}"
                    )
    return problems


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md, CHANGELOG.md and docs/**/*.md: tracked, or new and not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.md"],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout.split("\n")
    keep = []
    for name in sorted(set(filter(None, listed))):
        path = Path(name)
        if (root / path).is_file() and (
            name in ("README.md", "CHANGELOG.md") or path.parts[0] == "docs"
        ):
            keep.append(path)
    return keep


# -- commands ----------------------------------------------------------------------------


def generated() -> list[tuple[Path, str, str]]:
    return [
        (CONFIG_DOC, "settings", settings_table()),
        (CONFIG_DOC, "serving-settings", serving_settings_table()),
        (CLI_DOC, "cli", cli_reference()),
        (API_DOC, "api", api_reference()),
    ]


def generate() -> int:
    for path, name, body in generated():
        full = ROOT / path
        text = full.read_text(encoding="utf-8")
        new = replace_block(text, name, body)
        if new != text:
            full.write_text(new, encoding="utf-8")
            print(f"docs: wrote {path}")
    return 0


def status_problems(root: Path = ROOT) -> list[str]:
    """One problem per decision record without a `Status:` line (accepted, superseded...)."""
    return [
        f"{path.relative_to(root)}:1: no `Status:` line (say accepted, superseded or proposed)"
        for path in sorted((root / "docs" / "adr").glob("[0-9][0-9][0-9][0-9]-*.md"))
        if not re.search(r"^Status: ", path.read_text(encoding="utf-8"), re.MULTILINE)
    ]


def check() -> int:
    problems = link_problems(markdown_files()) + status_problems()
    for path, name, body in generated():
        problems += block_problems(path, name, body)
    for problem in problems:
        print(problem)
    if problems:
        print(f"docs check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("docs check: links, generated references and ADR statuses are up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate or check the documentation.")
    parser.add_argument("command", choices=["generate", "check"])
    args = parser.parse_args(argv)
    return generate() if args.command == "generate" else check()


if __name__ == "__main__":
    sys.exit(main())
