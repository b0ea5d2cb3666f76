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


_OPEN_TAG = re.compile(r"<[A-Za-z_][\w.-]*\s(?P<attrs>[^<>]*?)/?>")
_ATTR = re.compile(r"(?P<name>[A-Za-z_][\w.-]*)=\"(?P<value>[^\"]*)\"")


def _tool_summary(match: re.Match[str]) -> str:
    """A tool payload as the titles and locators of what it held (note reads, search hits)."""
    found: list[str] = []
    for tag in _OPEN_TAG.finditer(match.group(0)):
        attrs_ = dict((a.group("name"), a.group("value")) for a in _ATTR.finditer(tag["attrs"]))
        locator = attrs_.get("path") or attrs_.get("url") or attrs_.get("key")
        if locator is None:
            continue
        title = attrs_.get("title", "")
        item = f"{title} ({locator})" if title and title != locator else locator
        if item not in found:
            found.append(item)
    if not found:
        return f"[{match.group('tag')} omitted]"
    return f"[{match.group('tag')}: " + "; ".join(found) + "]"


def strip_reply(text: str) -> str:
    """Tool payloads become the titles and locators they held (``[<tag> omitted]`` if none);
    other context blocks become ``[context: key]``."""
    text = _TOOL_BLOCK.sub(_tool_summary, text)
    return _CONTEXT_BLOCK.sub(lambda m: f"[context: {m.group('key')}]", text)


def has_context_markup(text: str) -> bool:
    """True when ``text`` still holds a context block or a tool payload."""
    return bool(_CONTEXT_BLOCK.search(text) or _TOOL_BLOCK.search(text))
