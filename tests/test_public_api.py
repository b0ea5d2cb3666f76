"""Each package's ``__all__`` is exactly its public surface: nothing leaks, nothing is missing."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "package",
    ["lamina.pipeline", "lamina.processors", "lamina.renderers", "lamina", "lamina.adapters"],
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
