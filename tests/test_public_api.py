"""Each package's ``__all__`` is exactly its public surface: nothing leaks, nothing is missing."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

CORE_NAMESPACES = [
    "lamina.pipeline.agent",
    "lamina.pipeline.errors",
    "lamina.pipeline.inputs",
    "lamina.pipeline.layout",
    "lamina.pipeline.recall",
    "lamina.pipeline.sources",
    "lamina.pipeline.stages",
    "lamina.pipeline.store",
    "lamina.pipeline.text",
    "lamina.pipeline.tokens",
    "lamina.pipeline.tools",
    "lamina.pipeline.views",
]


@pytest.mark.parametrize(
    "package",
    [
        "lamina.pipeline",
        *CORE_NAMESPACES,
        "lamina.processors",
        "lamina.renderers",
        "lamina",
        "lamina.adapters",
    ],
)
def test_all_is_exactly_the_public_names(package: str) -> None:
    module = importlib.import_module(package)
    public = {
        name
        for name in dir(module)
        if not name.startswith("_") and not inspect.ismodule(getattr(module, name))
    }
    assert set(module.__all__) == public
    assert len(module.__all__) == len(set(module.__all__))


@pytest.mark.parametrize(
    "package", ["lamina.pipeline", "lamina.processors", "lamina.renderers", "lamina"]
)
def test_packages_ship_py_typed(package: str) -> None:
    module = importlib.import_module(package)
    assert (Path(inspect.getfile(module)).parent / "py.typed").is_file()


def test_the_cores_top_level_is_small() -> None:
    """What a host uses to build turns; the rest sits in the namespaces."""
    import lamina.pipeline

    assert len(lamina.pipeline.__all__) <= 40


def test_a_core_name_has_one_home() -> None:
    """No name is exported by two of the core's namespaces or by one and the top level
    (``LaminaError`` is the one exception: the root of ``errors`` and of the top level)."""
    homes: dict[str, list[str]] = {}
    for package in ["lamina.pipeline", *CORE_NAMESPACES]:
        for name in importlib.import_module(package).__all__:
            homes.setdefault(name, []).append(package)
    shared = {name: where for name, where in homes.items() if len(where) > 1}
    assert shared == {"LaminaError": ["lamina.pipeline", "lamina.pipeline.errors"]}


def test_the_namespaces_are_attributes_of_the_core() -> None:
    """``import lamina.pipeline`` is enough to reach ``lamina.pipeline.store.Store``."""
    import lamina.pipeline

    for package in CORE_NAMESPACES:
        assert getattr(lamina.pipeline, package.rpartition(".")[2]) is importlib.import_module(
            package
        )
