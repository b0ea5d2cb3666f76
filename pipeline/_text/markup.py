"""Lamina's block markup: one grammar renders, escapes and recognises context blocks.

A block Lamina renders opens with ``<T key="T:..."`` (T is its source type, and every
artifact key starts with its source type and a colon) and ends at the next ``</T>``; a
reference is ``<reference key="S:..." source="S" .../>``. JSX or HTML a person writes
(``<li key="id">``, ``<a key={x}>``) does not have that shape. Content inside a block
reaches the model as written except the few ``<`` that could open such a block, close
the enclosing one, or start a comment or CDATA section that never ends; those become
``&lt;``. So no content can forge a block, and only blocks Lamina rendered are found.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

import attrs

from lamina.pipeline._text.specials import defuse_special_tokens

__all__ = [
    "TOOL_TAGS",
    "MarkupBlock",
    "MarkupScan",
    "defuse_markup",
    "escape_attribute",
    "escape_body",
    "markup_blocks",
    "xml_safe",
]

# Tool payload wrappers that agent frameworks emit; a model may echo them in a reply.
TOOL_TAGS = ("tool_result", "tool_results", "function_results", "search_results", "tool_output")

_NAME = r"[A-Za-z_][\w.-]*"
# One tag as the scanner reads it: nothing between its < and > may be < or >.
_TAG = re.compile(r"<(?P<close>/?)(?P<name>" + _NAME + r")(?P<rest>[^<>]*)>")
_KEY = re.compile(r'\s+key="(?P<key>[^"]*)"(?:\s+source="(?P<source>[^"]*)")?')
_TOOL = frozenset(TOOL_TAGS)

# What escape_body rewrites: a superset of every opener _TAG/_KEY accept, so escaped
# content never holds one (``<T key="T:`` and any ``<reference key=``).
_OPENER = re.compile(r'<(?P<name>' + _NAME + r')\s+key="')
_TOOL_OPENER = re.compile(r"<(?:" + "|".join(TOOL_TAGS) + r")(?![\w.-])")
_COMMENT = "<!--"
_CDATA = "<![CDATA["
_ATTRIBUTE = str.maketrans(
    {'"': "&quot;", "<": "&lt;", ">": "&gt;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}
)


# XML 1.0 cannot carry C0 controls (other than tab, LF, CR) at all, not even escaped:
# they become their visible Unicode "control picture" (NUL -> U+2400), so the model
# still sees that something was there; other illegal code points become U+FFFD.
_C0 = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)}
_ILLEGAL = re.compile("[\ud800-\udfff\ufffe\uffff]")
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_C0_BYTES = bytes(_C0)


def xml_safe(text: str) -> str:
    """``text`` with the code points XML 1.0 cannot hold replaced (see module comment)."""
    if text.isascii():  # only C0 controls can be unsafe: a byte scan, several times a regex's
        raw = text.encode("ascii")
        if len(raw.translate(None, _C0_BYTES)) == len(raw):
            return text
    elif _UNSAFE.search(text) is None:  # the usual case: one scan, no copy
        return text
    return _ILLEGAL.sub("\ufffd", text.translate(_C0))


def escape_attribute(value: str) -> str:
    """An attribute value as written except ``"``, ``<``, ``>`` and line breaks, which would
    end the value or the tag (``&`` stays: URLs keep their query strings), and special-token
    spellings (``defuse_special_tokens``)."""
    return defuse_special_tokens(value).translate(_ATTRIBUTE)


def escape_body(text: str, tag: str) -> str:
    """``text`` as written, except a ``<`` that opens a Lamina block, closes ``</tag``, or
    starts a comment or CDATA section with no end in ``text``: that one becomes ``&lt;``;
    and a special-token spelling is defused (``defuse_special_tokens``)."""
    text = defuse_special_tokens(text)
    if "<" not in text:
        return text
    spots = {m.start() for m in _closer(tag).finditer(text)} | _openers(text)
    for opener, end in ((_COMMENT, "-->"), (_CDATA, "]]>")):
        at = text.rfind(opener)
        if at >= 0 and text.find(end, at + len(opener)) < 0:
            # Only openers after the last end can run past the block; escape those.
            last_end = text.rfind(end)
            start = text.find(opener, last_end + len(end) if last_end >= 0 else 0)
            while start >= 0:
                spots.add(start)
                start = text.find(opener, start + 1)
    return _escape_at(text, spots)


@functools.lru_cache(maxsize=64)
def _closer(tag: str) -> re.Pattern[str]:
    return re.compile(r"</" + re.escape(tag) + r"(?![\w.-])")


def _openers(text: str) -> set[int]:
    """Where a ``<`` starts anything the scanner could read as a Lamina opener."""
    spots: set[int] = set()
    for m in _OPENER.finditer(text):
        name = m.group("name")
        if name == "reference" or text.startswith(name + ":", m.end()):
            spots.add(m.start())
    return spots


def defuse_markup(text: str) -> str:
    """``text`` with every ``<`` that could open a Lamina block or a tool payload escaped:
    afterwards ``markup_blocks`` finds nothing (removing a ``<`` cannot make one)."""
    return _escape_at(text, _openers(text) | {m.start() for m in _TOOL_OPENER.finditer(text)})


def _escape_at(text: str, spots: set[int]) -> str:
    if not spots:
        return text
    out: list[str] = []
    prev = 0
    for at in sorted(spots):
        out.append(text[prev:at])
        out.append("&lt;")
        prev = at + 1
    out.append(text[prev:])
    return "".join(out)


@attrs.frozen
class MarkupBlock:
    """A block found in text: ``[start, end)``, its tag, its key ("" for a tool payload)."""

    start: int
    end: int
    tag: str
    key: str


@attrs.define
class MarkupScan:
    """One left-to-right pass; ``steps`` counts tags visited and closer look-ups advanced,
    so a test can show the work grows linearly with the text."""

    text: str
    steps: int = 0

    def blocks(self) -> Iterator[MarkupBlock]:
        tags = list(_TAG.finditer(self.text))
        closers: dict[str, list[int]] = {}  # tag name -> indexes into tags, in order
        for i, m in enumerate(tags):
            self.steps += 1
            if m.group("close") and not m.group("rest").strip():
                closers.setdefault(m.group("name"), []).append(i)
        cursor: dict[str, int] = {}  # per tag name: first closer not yet passed
        i = 0
        while i < len(tags):
            self.steps += 1
            m = tags[i]
            i += 1
            if m.group("close"):
                continue
            name, rest = m.group("name"), m.group("rest")
            key = _marker_key(name, rest)
            if key is None:
                continue
            if rest.endswith("/"):
                yield MarkupBlock(m.start(), m.end(), name, key)
                continue
            found = closers.get(name, [])
            at = cursor.get(name, 0)
            while at < len(found) and found[at] < i:
                at += 1
                self.steps += 1
            cursor[name] = at
            if at == len(found):
                continue  # never closed: not a block
            close = tags[found[at]]
            yield MarkupBlock(m.start(), close.end(), name, key)
            i = found[at] + 1


def _marker_key(name: str, rest: str) -> str | None:
    """The key of a Lamina opener (a tool payload's is ""), None for any other tag."""
    if name in _TOOL:
        return "" if not rest or rest[0].isspace() or rest == "/" else None
    m = _KEY.match(rest)
    if m is None:
        return None
    key = m.group("key")
    if name == "reference":
        source = m.group("source")
        return key if source and key.startswith(source + ":") else None
    return key if key.startswith(name + ":") else None


def markup_blocks(text: str) -> list[MarkupBlock]:
    """The Lamina blocks and tool payloads in ``text``, in order, not overlapping (linear)."""
    return list(MarkupScan(text).blocks())
