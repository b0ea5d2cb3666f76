"""Untrusted input: file reads confined to a folder, and YAML or JSON loaded within limits."""

from lamina.pipeline._input.files import FileProblem, read_confined, read_regular
from lamina.pipeline._input.safeload import LoadError, LoadLimits, load_json, load_yaml

__all__ = [
    "FileProblem",
    "LoadError",
    "LoadLimits",
    "load_json",
    "load_yaml",
    "read_confined",
    "read_regular",
]
