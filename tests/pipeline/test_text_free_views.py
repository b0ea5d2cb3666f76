"""The views never make a text-free block: a preview or summary of a note with frontmatter
closes it or starts after it, and holds prose, not only its omitted-sections line."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._views.preview import (
    OMITTED_LINE,
    fit_preview,
    frontmatter_end,
    make_preview,
)
from lamina.pipeline._views.summarize import TextRankSummarizer

COUNTER = TokenCounter()

PROPERTIES = "\n".join(
    [
        "---",
        'categories: ["[[Books]]"]',
        "cover: https://example.org/covers/out-of-control-a-very-long-address.jpg",
        "isbn13: 9780201483406",
        "pages: 528",
        'author: ["[[Kevin Kelly]]"]',
        'genre: ["[[Futurism]]", "[[Systems]]", "[[Biology]]", "[[Economics]]"]',
        "---",
    ]
)
PROSE = (
    "Out of Control is a book about systems that organize themselves. "
    "Kelly argues that machines are becoming biological and the biological is becoming "
    "engineered. Hives, markets and networks show how order comes from many small parts. "
)
NOTE = f"{PROPERTIES}\n\n{PROSE * 6}\n\n# Notes\n\n{PROSE * 2}"


def _open(text: str) -> bool:
    """A text that opens frontmatter and never closes it."""
    return text.startswith("---\n") and frontmatter_end(text) == 0


def _prose(text: str) -> bool:
    """A line outside frontmatter that is neither a heading nor an omitted-sections line."""
    lines = text[frontmatter_end(text) :].strip().split("\n")
    return any(
        line.strip() and not line.startswith("#") and not OMITTED_LINE.fullmatch(line.strip())
        for line in lines
    )


def test_frontmatter_end_is_after_its_closing_line_and_0_when_open() -> None:
    assert frontmatter_end("---\na: 1\n---\nText.") == len("---\na: 1\n---")
    assert frontmatter_end("---\na: 1\nText.") == 0
    assert frontmatter_end("Text.\n---\n") == 0
    assert frontmatter_end("---\na: ---x\n---") == len("---\na: ---x\n---")
    assert frontmatter_end("---\n\nA rule, then text.\n---\nMore.") == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=8, max_value=400))
def test_a_fitted_preview_of_a_note_with_frontmatter_never_leaves_it_open(tokens: int) -> None:
    preview = fit_preview(NOTE, COUNTER, tokens)
    assert not _open(preview), preview
    assert _prose(preview), preview


def test_a_small_fitted_preview_starts_after_frontmatter_it_cannot_close() -> None:
    """At 40 tokens the properties (about 90) do not fit: the preview is the note's text."""
    preview = fit_preview(NOTE, COUNTER, 40)
    assert preview.startswith("Out of Control is a book"), preview
    assert COUNTER.count(preview) <= 40


def test_a_headless_preview_closes_or_skips_frontmatter() -> None:
    body = f"{PROPERTIES}\n\n{PROSE * 8}"
    for limit in (8, 30, 60, 120, 600):
        text = make_preview(body, COUNTER, headless_tokens=limit).text
        assert not _open(text) and _prose(text), (limit, text)


def test_properties_that_fit_give_way_to_text_when_no_section_fits_beside_them() -> None:
    """Release notes: short properties, a bare heading, then sections each larger than the
    room left: the preview holds the start of a section's text, not properties, a heading
    and an omitted line."""
    short = "---\ntags: [desktop, insider]\ndate: 2025-10-21\n---"
    note = f"{short}\n\n# Improved\n\n## Desktop\n\n{PROSE * 3}\n\n## Mobile\n\n{PROSE * 3}"
    for tokens in (40, 50, 60):
        preview = fit_preview(note, COUNTER, tokens)
        assert _prose(preview) and COUNTER.count(preview) <= tokens, (tokens, preview)


def test_a_section_cut_where_only_its_heading_fits_shows_its_text() -> None:
    """A long heading and long sections at 30 tokens: the text's first words, not the
    heading cut short and an omitted line."""
    heading = "## Finding notes by their tags, nested tags and the tag pane of the sidebar"
    note = f"{heading}\n\n{PROSE * 3}\n\n## Other\n\n{PROSE * 3}\n\n## More\n\n{PROSE}"
    for tokens in (24, 30, 36):
        preview = fit_preview(note, COUNTER, tokens)
        assert _prose(preview), (tokens, preview)


def test_a_note_of_only_properties_is_cut_at_a_line_and_closed() -> None:
    preview = fit_preview(PROPERTIES, COUNTER, 40)
    assert preview.startswith("---\n") and frontmatter_end(preview) > 0, preview


def test_a_single_section_note_previewed_small_holds_its_text_not_only_the_omitted_line() -> None:
    """A note of 1,400 bytes of prose and no heading, at 20 tokens: its first words."""
    note = (PROSE * 6)[:1400]
    preview = fit_preview(note, COUNTER, 20)
    assert _prose(preview) and preview.startswith("Out of Control"), preview


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=4, max_value=300))
def test_a_summary_of_a_note_with_frontmatter_holds_prose_and_no_open_properties(
    tokens: int,
) -> None:
    summary = TextRankSummarizer(COUNTER).summarize(NOTE, tokens).text
    assert not _open(summary), summary
    assert summary == "" or _prose(summary), summary
    assert COUNTER.count(summary) <= tokens


def test_a_summary_never_picks_an_omitted_sections_line() -> None:
    """A preview summarized again: its omitted line is a count, not a sentence."""
    text = f"{PROSE}\n\n[... 3 more sections omitted ...]"
    for tokens in (10, 20, 40):
        summary = TextRankSummarizer(COUNTER).summarize(text, tokens).text
        assert "omitted" not in summary and _prose(summary), summary
