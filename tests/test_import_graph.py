"""The module graph of the engine and the benchmark beside it has no circle.

import-linter keeps the layers one way; this also catches a circle between two modules
of one layer, including imports made only for type checking."""

from __future__ import annotations

import grimp


def test_no_module_imports_itself_through_another() -> None:
    graph = grimp.build_graph("deltabus", "deltabus_bench", cache_dir=None)
    circles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append(" -> ".join((module, *back)))
    assert circles == [], "\n".join(circles)
