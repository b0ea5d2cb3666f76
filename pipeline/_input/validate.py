"""The checks at the public API's edge: wrong types and values become typed errors.

Each public entry point (``Conversation``, ``Budget``, ``Conversation.turn`` ...) calls
these before it changes anything, so a caller's mistake is an ``ArgumentError`` or a
``ConfigError`` naming the argument, never a ``TypeError`` from deep inside a stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lamina.pipeline._errors import ArgumentError, ConfigError

__all__ = [
    "attachments",
    "flag",
    "integer",
    "number",
    "optional_text",
    "text",
    "text_mapping",
    "tool_specs",
]


def _kind(value: object) -> str:
    return type(value).__name__


def text(argument: str, value: object) -> str:
    """``value`` if it is a str; bytes get a hint to decode them first."""
    if isinstance(value, str):
        return value
    hint = " (decode bytes to str first)" if isinstance(value, bytes | bytearray) else ""
    raise ArgumentError(argument, f"must be a str, got {_kind(value)}{hint}")


def flag(argument: str, value: object) -> bool:
    """``value`` if it is a bool (not 0 or 1, which read as a count)."""
    if isinstance(value, bool):
        return value
    raise ArgumentError(argument, f"must be True or False, got {_kind(value)}")


def optional_text(argument: str, value: object) -> str | None:
    return None if value is None else text(argument, value)


def text_mapping(argument: str, value: object) -> dict[str, str]:
    """A mapping of str to str (vault changes), copied."""
    if not isinstance(value, Mapping):
        raise ArgumentError(argument, f"must be a mapping of path to text, got {_kind(value)}")
    for key, item in value.items():
        text(f"{argument} key", key)
        text(f"{argument}[{key!r}]", item)
    return dict(value)


def _is_spec(value: object) -> bool:
    return isinstance(getattr(value, "kind", None), str) and callable(
        getattr(value, "describe", None)
    )


def attachments(argument: str, value: object) -> list[Any]:
    """A list of attachment specs or script-form mappings (not a bare str or mapping)."""
    if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise ArgumentError(
            argument,
            f"must be a list of attachments (specs or mappings such as "
            f"{{'note': 'a.md'}}), got {_kind(value)} {_short(value)}",
        )
    items = list(value)
    for i, item in enumerate(items):
        if not (isinstance(item, Mapping) or _is_spec(item)):
            raise ArgumentError(
                f"{argument}[{i}]",
                f"must be an attachment spec or a mapping, got {_kind(item)}",
            )
    return items


def tool_specs(argument: str, value: object) -> list[Any]:
    """Turn-scoped specs that carry their own content (``lamina.pipeline.tools.tool``,
    ``.hits``)."""
    if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise ArgumentError(argument, f"must be a list of tool specs, got {_kind(value)}")
    items = list(value)
    for i, item in enumerate(items):
        if not (_is_spec(item) and callable(getattr(item, "processed", None))):
            raise ArgumentError(
                f"{argument}[{i}]",
                f"must be a spec that carries its content (pipeline.tool(...), pipeline.hits(...)),"
                f" got {_kind(item)}",
            )
    return items


def integer(setting: str, value: object, *, minimum: int) -> int:
    """An int (not a bool, not a numeric string) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(setting, f"must be an integer, got {_kind(value)} {_short(value)}")
    if value < minimum:
        raise ConfigError(setting, f"must be at least {minimum}, got {value}")
    return value


def number(setting: str, value: object) -> float:
    """A real number (int or float, not a bool or a string), as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(setting, f"must be a number, got {_kind(value)} {_short(value)}")
    return float(value)


def _short(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
