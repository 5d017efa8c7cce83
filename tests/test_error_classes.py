"""Every exception a user may catch lives in `deltabus.errors` and says whether it is
retriable; old import paths name the same classes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import deltabus
import deltabus.errors as errors

PACKAGE = Path(deltabus.__file__).parent

# Exceptions that never leave the module raising them: each is caught where it is raised.
INTERNAL = {
    "BulkItemsFailed",  # adapters.serving.opensearch_connection: turned into a retry
    "ItemReadsFailed",  # adapters.serving.opensearch_connection: turned into a retry
    "PositionMovedError",  # adapters.serving.sink_loop: the sink starts again
    "Unsupported",  # delta.checkpoint_state: delta-rs writes the checkpoint instead
}
# Builtin bases an exception class of deltabus derives from.
BUILTIN_BASES = {"Exception", "ValueError", "RuntimeError", "OSError", "TimeoutError"}


def _exception_classes() -> list[tuple[str, str]]:
    """(module path, class name) of every public module-level class in deltabus deriving
    from an exception: a builtin one, or one defined in deltabus, followed by name."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                ]
                classes[node.name] = (str(path.relative_to(PACKAGE)), bases)

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in BUILTIN_BASES:
            return True
        if name in seen or name not in classes:
            return False
        return any(is_exception(b, seen | {name}) for b in classes[name][1])

    return sorted(
        (where, name)
        for name, (where, _) in classes.items()
        if not name.startswith("_") and is_exception(name)
    )


def test_every_public_exception_is_in_deltabus_errors() -> None:
    found = _exception_classes()
    assert len(found) >= 20
    outside = [
        (where, name)
        for where, name in found
        if name not in errors.__all__ and name not in INTERNAL
    ]
    assert outside == [], "add these to deltabus.errors (or to INTERNAL, with the reason)"
    for name in errors.__all__:
        assert ("core/errors.py", name) in found, f"{name} is defined in deltabus/core/errors.py"


@pytest.mark.parametrize("name", errors.__all__)
def test_each_error_states_whether_it_is_retriable(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, Exception)
    assert "retriable" in vars(cls), f"{name} states `retriable` itself"
    assert isinstance(cls.retriable, bool)
    assert getattr(deltabus, name) is cls


@pytest.mark.parametrize(
    ("name", "retriable"),
    [
        ("FencedError", False),  # a newer writer owns the table: retrying cannot help
        ("ConfigError", False),
        ("RecordError", False),
        ("StorageError", False),  # credentials, bucket, full disk: the user must act
        ("OffsetOutOfRangeError", False),
        ("RemovedFileError", False),
        ("StoppedDuringOutage", True),  # storage was unavailable: a later start resumes
        ("PostgresUnreachable", True),
        ("OpenSearchUnreachable", True),
        ("BufferFullError", True),
        ("VersionTakenError", True),
        ("CompactionConflict", True),
    ],
)
def test_errors_are_classified(name: str, retriable: bool) -> None:
    assert getattr(errors, name).retriable is retriable


def test_instances_carry_the_class_verdict() -> None:
    from deltabus.bus.fence import FencedError

    assert FencedError("claimed by epoch 3").retriable is False
    assert errors.RecordError("bad key").retriable is False
    assert isinstance(errors.RecordError("bad key"), errors.ConfigError)


def test_old_import_paths_name_the_same_classes() -> None:
    from deltabus.adapters.serving.opensearch_connection import OpenSearchRed, OpenSearchUnreachable
    from deltabus.adapters.serving.pg import PostgresUnreachable
    from deltabus.bus.fence import FencedError
    from deltabus.bus.producer import BufferFullError, RecordError
    from deltabus.bus.tail import UnreadableFileError
    from deltabus.core.errors import (
        ChangeWithoutCdfError,
        InputTableError,
        RemovedFileError,
        UnsupportedFeatureError,
    )
    from deltabus.core.retry import StoppedDuringOutage
    from deltabus.delta.append import VersionTakenError
    from deltabus.delta.compaction import CompactionConflict
    from deltabus.delta.retention import RetentionConflict

    old = [
        OpenSearchRed,
        OpenSearchUnreachable,
        PostgresUnreachable,
        FencedError,
        BufferFullError,
        RecordError,
        UnreadableFileError,
        StoppedDuringOutage,
        VersionTakenError,
        CompactionConflict,
        ChangeWithoutCdfError,
        InputTableError,
        RemovedFileError,
        UnsupportedFeatureError,
        RetentionConflict,
    ]
    for cls in old:
        assert getattr(errors, cls.__name__) is cls
