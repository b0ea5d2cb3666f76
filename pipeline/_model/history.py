"""L4 history: bare user texts and assistant replies stripped of context and tool payloads."""

from __future__ import annotations

import re

import attrs

from lamina.pipeline._text.markup import (
    TOOL_TAGS,
    MarkupBlock,
    MarkupScan,
    defuse_markup,
    markup_blocks,
)

__all__ = [
    "TOOL_TAGS",
    "Head",
    "HistoryEntry",
    "has_context_markup",
    "strip_reply",
]


@attrs.frozen
class HistoryEntry:
    """One earlier turn as L4 keeps it."""

    turn: int
    user: str
    assistant: str | None = None


_OPEN_TAG = re.compile(r"<[A-Za-z_][\w.-]*\s(?P<attrs>[^<>]*?)/?>")
_ATTR = re.compile(r"(?P<name>[A-Za-z_][\w.-]*)=\"(?P<value>[^\"]*)\"")
# Stripping can join the pieces of an opener that a block interrupted into a new block;
# each pass is linear, and after these what could still open a block is escaped instead.
_PASSES = 4


def _tool_summary(tag: str, payload: str) -> str:
    """A tool payload as the titles and locators of what it held (note reads, search hits)."""
    found: list[str] = []
    for open_tag in _OPEN_TAG.finditer(payload):
        pairs = _ATTR.finditer(open_tag["attrs"])
        attrs_ = dict((a.group("name"), a.group("value")) for a in pairs)
        locator = attrs_.get("path") or attrs_.get("url") or attrs_.get("key")
        if locator is None:
            continue
        title = attrs_.get("title", "")
        item = f"{title} ({locator})" if title and title != locator else locator
        if item not in found:
            found.append(item)
    if not found:
        return f"[{tag} omitted]"
    return f"[{tag}: " + "; ".join(found) + "]"


def _replacement(text: str, block: MarkupBlock) -> str:
    if block.tag in TOOL_TAGS:
        return _tool_summary(block.tag, text[block.start : block.end])
    return f"[context: {block.key}]"


def _strip_once(text: str, blocks: list[MarkupBlock]) -> str:
    out: list[str] = []
    prev = 0
    for block in blocks:
        out.append(text[prev : block.start])
        out.append(_replacement(text, block))
        prev = block.end
    out.append(text[prev:])
    return "".join(out)


def strip_reply(text: str) -> str:
    """A reply's leading reasoning block is dropped (``drop_reasoning``); tool payloads
    become the titles and locators they held (``[<tag> omitted]`` if none); Lamina's context
    blocks (see ``lamina.pipeline._text.markup``) become ``[context: key]``. Any other markup (JSX,
    HTML, XML a person wrote) stays byte for byte. Linear in ``len(text)``."""
    return stripped_with_steps(drop_reasoning(text))[0]


def drop_reasoning(text: str) -> str:
    """A reply that opens with a reasoning block (``<think>...</think>``, as Qwen3, QwQ and
    DeepSeek-R1 write it) without that block: what follows the last ``</think>``, leading
    newlines dropped. Their chat templates drop it from earlier turns the same way, so the
    history holds what the model is sent (and a ``</think>`` elsewhere stays text)."""
    if not text.lstrip().startswith("<think>") or "</think>" not in text:
        return text
    return text.rsplit("</think>", 1)[1].lstrip("\n")


def stripped_with_steps(text: str) -> tuple[str, int]:
    """``strip_reply(text)`` and the steps it took (tags scanned, closers passed, blocks
    replaced, characters of tool payloads read again): the linearity test compares these."""
    steps = 0
    for _ in range(_PASSES):
        scan = MarkupScan(text)
        blocks = list(scan.blocks())
        steps += scan.steps + len(blocks)
        if not blocks:
            return text, steps
        text = _strip_once(text, blocks)
        steps += sum(b.end - b.start for b in blocks if b.tag in TOOL_TAGS)
    scan = MarkupScan(text)
    if next(scan.blocks(), None) is None:
        return text, steps + scan.steps
    return defuse_markup(text), steps + scan.steps


def has_context_markup(text: str) -> bool:
    """True when ``text`` still holds a Lamina context block or a tool payload."""
    return bool(markup_blocks(text))


@attrs.frozen
class Head:
    """Where a stored conversation stands: its last turn and that turn's state hash.

    A save names the head it continues (``parent``); the empty conversation is
    ``Head(0, "")``. The hash covers the whole saved state (its content-addressed parts),
    so two writers that both continue turn N from different states never look alike.
    """

    turn: int = 0
    hash: str = ""
