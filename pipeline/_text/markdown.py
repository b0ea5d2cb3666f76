"""Markdown line rules shared by notes, previews and summaries: fences, headings, sections.

One owner for each rule, so the note parser, the previewer and the summarizer agree on
where a code fence opens and closes and where a section starts.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator

__all__ = [
    "FENCE_LINE",
    "HEADING_OR_FENCE",
    "fence_after",
    "heading_or_fence_lines",
    "section_spans",
    "split_sections",
    "trim_blank_lines",
]

HEADING_OR_FENCE = re.compile(
    r"^ {0,3}(?:(?P<heading>#{1,6})(?:[ \t][^\n]*)?$|(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$)",
    re.MULTILINE,
)
# Where such a line may start: a literal-first pattern the regex engine scans quickly.
_LINE_CANDIDATE = re.compile(r"\n {0,3}[#`~]")
FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})([^\n]*)$", re.MULTILINE)


def fence_after(fence: str | None, mark: str, rest: str) -> str | None:
    """The fence left open after a line that starts (indented up to 3) with the fence run
    ``mark`` followed by ``rest``, when ``fence`` was open before it (None: none was).

    A backtick run with a backtick after it is inline code, not a fence; a fence closes on
    a run of its character at least as long, with nothing but blanks after it.
    """
    if fence is None:
        return None if mark[0] == "`" and "`" in rest else mark
    if mark[0] == fence[0] and len(mark) >= len(fence) and not rest.strip():
        return None
    return fence


def trim_blank_lines(text: str) -> str:
    """``text`` without leading blank lines and trailing whitespace (indentation kept)."""
    blank = len(text) - len(text.lstrip(" \t\n"))  # where the first visible line's text starts
    return text[text.rfind("\n", 0, blank) + 1 :].rstrip()


def heading_or_fence_lines(body: str) -> Iterator[re.Match[str]]:
    """``HEADING_OR_FENCE.finditer(body)``, trying only lines that can match."""
    starts = itertools.chain((0,), (c.start() + 1 for c in _LINE_CANDIDATE.finditer(body)))
    for start in starts:
        m = HEADING_OR_FENCE.match(body, start)
        if m is not None:
            yield m


def split_sections(body: str) -> list[tuple[str | None, str]]:
    """(heading line or None, section body) pairs split at ATX headings outside code fences."""
    return [(heading, text) for heading, text, _ in section_spans(body)]


def section_spans(body: str) -> tuple[tuple[str | None, str, tuple[int, int]], ...]:
    """``split_sections`` with where each section lies in ``body`` (heading line included):
    the spans follow each other, the first starting where the first kept section does.

    A turn that fits a note to a preview asks twice (its count, its preview): the last few
    bodies up to ``_SPANS_KEPT_CHARS`` are remembered."""
    if len(body) > _SPANS_KEPT_CHARS:
        return _section_spans(body)
    return _kept_spans(body)


_SPANS_KEPT_CHARS = 1 << 16


@functools.lru_cache(maxsize=8)
def _kept_spans(body: str) -> tuple[tuple[str | None, str, tuple[int, int]], ...]:
    return _section_spans(body)


def _section_spans(body: str) -> tuple[tuple[str | None, str, tuple[int, int]], ...]:
    starts: list[tuple[int, int]] = []  # (line start, line end) of each heading
    fence: str | None = None
    for m in heading_or_fence_lines(body):
        if m.group("fence") is not None:
            fence = fence_after(fence, m.group("fence"), m.group("info"))
        elif fence is None:
            starts.append((m.start(), m.end()))
    if not starts:
        return ((None, body, (0, len(body))),)
    sections: list[tuple[str | None, str, tuple[int, int]]] = []
    if body[: starts[0][0]].strip():
        sections.append((None, body[: starts[0][0]], (0, starts[0][0])))
    for i, (start, end) in enumerate(starts):
        nxt = starts[i + 1][0] if i + 1 < len(starts) else len(body)
        sections.append((body[start:end].strip(), body[end + 1 : nxt], (start, nxt)))
    return tuple(sections)
