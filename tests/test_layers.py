"""The layers import one way: lamina -> processors, renderers -> pipeline; nothing reaches back.

The three layers live in the repository's ``pipeline/``, ``processors/`` and ``renderers/``
folders and install as ``lamina.pipeline``, ``lamina.processors`` and ``lamina.renderers``;
the rest of ``lamina`` is the application layer.

Every import counts, at module level or deferred inside a function, under TYPE_CHECKING
or not: a lazy import is still a dependency. Tests may import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "processors", "renderers", "lamina")
LAYERS = ("pipeline", "processors", "renderers")
# Which packages each package may import (itself always).
ALLOWED = {
    "pipeline": set(),
    "processors": {"pipeline"},
    "renderers": {"pipeline"},
    "lamina": {"pipeline", "processors", "renderers"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] in LAYERS:
        parts = ("lamina", *parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(name: str) -> tuple[str, list[str]]:
    """The package a module name belongs to, and its parts below that package."""
    names = name.split(".")
    if names[0] == "lamina" and len(names) > 1 and names[1] in LAYERS:
        return names[1], names[2:]
    return names[0], names[1:]


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """Absolute names of every module ``path`` imports, with the line (those made only for
    type checking too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            yield name, node.lineno
            for alias in node.names:  # ``from pkg import _private_module``
                if alias.name.startswith("_"):
                    yield f"{name}.{alias.name}", node.lineno


def _files(package: str) -> list[Path]:
    """A package's own files; the application's folder links the layers in, which it skips."""
    own = ROOT / package
    return sorted(
        p for p in own.rglob("*.py") if not any((own / layer) in p.parents for layer in LAYERS)
    )


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from _files(package)


def _is_private(name: str) -> bool:
    return any(part.startswith("_") for part in _unit(name)[1])


def test_packages_import_one_way() -> None:
    wrong = []
    for path in _sources():
        own = path.relative_to(ROOT).parts[0]
        for name, line in _imports(path):
            top = _unit(name)[0]
            if top in PACKAGES and top != own and top not in ALLOWED[own]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert wrong == []


def test_no_package_imports_another_packages_private_module() -> None:
    wrong = []
    for path in _sources():
        own = path.relative_to(ROOT).parts[0]
        for name, line in _imports(path):
            top = _unit(name)[0]
            if top in PACKAGES and top != own and _is_private(name):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("package", PACKAGES)
def test_the_concern_folders_of_a_package_do_not_import_in_a_circle(package: str) -> None:
    """Inside a package, its first-level modules and folders form a graph without cycles,
    imports made only for type annotations included: they are dependencies too."""
    graph: nx.DiGraph = nx.DiGraph()
    for path in _files(package):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if len(parts) < 2 or parts[1] == "__init__":
            continue
        unit = parts[1]
        graph.add_node(unit)
        for name, _ in _imports(path):
            top, names = _unit(name)
            if top == package and names and names[0] != unit:
                graph.add_edge(unit, names[0])
    graph.remove_nodes_from([n for n in list(graph) if n == "__init__"])
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert cycles == []
