"""Markdown line rules (pipeline._text.markdown): blank-line trimming and section spans."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.pipeline._text.markdown import section_spans, split_sections, trim_blank_lines
from tests.strategies import MARKDOWN_LINE

_BLANKS = st.lists(
    st.sampled_from([" ", "\t", "\n", "\r", "\x0b", "\xa0", "x", "  y"]), max_size=10
)


@settings(max_examples=500, deadline=None)
@given(text=_BLANKS.map("".join))
def test_trimming_drops_leading_blank_lines_and_trailing_whitespace(text: str) -> None:
    """The rule as a regular expression states it: whole blank lines of spaces and tabs
    go, the first kept line keeps its indentation."""
    assert trim_blank_lines(text) == re.sub(r"\A(?:[ \t]*\n)+", "", text).rstrip()


@settings(max_examples=300, deadline=None)
@given(body=st.lists(MARKDOWN_LINE, max_size=40).map("\n".join))
def test_section_spans_are_the_sections_where_they_lie(body: str) -> None:
    """Each span holds its heading line and its section's body, and the spans follow each
    other to the end of the body."""
    spans = section_spans(body)
    assert [(h, b) for h, b, _ in spans] == split_sections(body)
    for (heading, text, (start, stop)), nxt in zip(spans, [*spans[1:], None], strict=True):
        assert body[start:stop].endswith(text)
        if heading is not None:
            assert body[start:stop].split("\n", 1)[0].strip() == heading
        assert stop == (len(body) if nxt is None else nxt[2][0])
