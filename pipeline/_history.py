"""L4 history: bare user texts and assistant replies stripped of context and tool payloads."""

from __future__ import annotations

import re

import attrs

__all__ = ["TOOL_TAGS", "HistoryEntry", "has_context_markup", "strip_reply"]

# Tool payload wrappers that agent frameworks and our own tool rendering emit.
TOOL_TAGS = ("tool_result", "tool_results", "function_results", "search_results", "tool_output")

# A context block as Lamina renders it: an element whose key attribute names an artifact.
_CONTEXT_BLOCK = re.compile(
    r"<(?P<tag>[A-Za-z_][\w.-]*)\s[^<>]*?\bkey=\"(?P<key>[^\"]*)\"[^<>]*?(?:/>|>.*?</(?P=tag)\s*>)",
    re.DOTALL,
)
_TOOL_BLOCK = re.compile(
    r"<(?P<tag>" + "|".join(TOOL_TAGS) + r")\b[^<>]*>.*?</(?P=tag)\s*>", re.DOTALL
)


@attrs.frozen
class HistoryEntry:
    """One earlier turn as L4 keeps it."""

    turn: int
    user: str
    assistant: str | None = None


def strip_reply(text: str) -> str:
    """Replace context blocks by ``[context: key]`` and tool payloads by ``[<tag> omitted]``."""
    text = _CONTEXT_BLOCK.sub(lambda m: f"[context: {m.group('key')}]", text)
    return _TOOL_BLOCK.sub(lambda m: f"[{m.group('tag')} omitted]", text)


def has_context_markup(text: str) -> bool:
    """True when ``text`` still holds a context block or a tool payload."""
    return bool(_CONTEXT_BLOCK.search(text) or _TOOL_BLOCK.search(text))
