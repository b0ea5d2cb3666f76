"""Structure + preview, marked excerpts and token cuts (pipeline._views.preview)."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._views.preview import (
    EXCERPT_MIN_TOKENS,
    OMITTED_LINE,
    cut_to_tokens,
    fit_preview,
    has_prose,
    make_excerpt,
    make_preview,
    refitted_preview,
)
from tests.strategies import MARKDOWN_LINE

COUNTER = TokenCounter()

NOTE = "\n".join(
    [
        "Lamina builds prompts from typed artifacts. "
        "It keeps the cached prefix stable across turns.",
        "",
        "# Goals",
        "",
        "Every request must fit the window. Nothing that cannot be fetched again may be lost. "
        "The prefix stays byte-identical between turns.",
        "",
        "## Non-goals",
        "",
        "Streaming is out of scope.",
        "",
        "## Example",
        "",
        "```python",
        "# this comment is not a heading",
        "def turn(text):",
        "    return envelope(text) + other(text) + more(text)",
        "```",
        "",
        "Done.",
        "",
    ]
)

NOTE_PREVIEW = "\n".join(
    [
        "Lamina builds prompts from typed artifacts. It keeps the cached prefix stable across ...",
        "",
        "# Goals",
        "Every request must fit the window. Nothing that cannot be fetched again may be ...",
        "",
        "## Non-goals",
        "Streaming is out of scope.",
        "",
        "## Example",
        "```python",
        "# this comment is not a heading",
        "def",
        "```",
        "...",
    ]
)


def _sections(n: int, words: int = 10) -> str:
    return "\n\n".join(f"## Part {i}\n\n" + " ".join(["word"] * words) + "." for i in range(n))


def _fence_open_at_end(text: str) -> bool:
    """CommonMark's rule, for backtick fences: any fence opens, a bare one closes."""
    open_fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            # Outside a fence any fence line opens one; inside, only a bare one closes it.
            open_fence = not open_fence or line.strip() != "```"
    return open_fence


def test_small_note_preview_is_exact() -> None:
    """Headings kept, bodies cut at a sentence or word end with an ellipsis, fence closed."""
    preview = make_preview(NOTE, COUNTER, section_tokens=16)
    assert preview.text == NOTE_PREVIEW
    assert (preview.sections_total, preview.sections_kept, preview.cut) == (4, 4, True)


def test_note_within_limits_is_kept_whole() -> None:
    preview = make_preview("# Title\n\nShort body.\n\n## Next\n\nAlso short.\n", COUNTER)
    assert preview.text == "# Title\nShort body.\n\n## Next\nAlso short."
    assert preview.cut is False


def test_dropped_sections_are_counted() -> None:
    preview = make_preview(_sections(25), COUNTER, max_sections=20)
    assert preview.text.endswith("\n\n[... 5 more sections omitted ...]")
    assert "## Part 19\n" in preview.text and "## Part 20" not in preview.text
    assert (preview.sections_total, preview.sections_kept, preview.cut) == (25, 20, True)


def test_one_dropped_section_is_singular() -> None:
    preview = make_preview(_sections(3), COUNTER, max_sections=2)
    assert preview.text.endswith("[... 1 more section omitted ...]")


def test_text_before_the_first_heading_is_a_section() -> None:
    preview = make_preview("Intro line.\n\n# A\n\nBody.", COUNTER, max_sections=1)
    assert preview.text == "Intro line.\n\n[... 1 more section omitted ...]"


def test_headless_note_keeps_its_first_tokens() -> None:
    body = " ".join(f"Sentence number {i} says something." for i in range(400))
    preview = make_preview(body, COUNTER, headless_tokens=100)
    assert preview.cut is True
    assert preview.text.endswith(" ...")
    assert body.startswith(preview.text.removesuffix(" ..."))
    assert preview.text.removesuffix(" ...").endswith(".")
    assert 50 <= COUNTER.count(preview.text) <= 100


def test_short_headless_note_is_unchanged() -> None:
    preview = make_preview("\n\nJust a line.\n", COUNTER)
    assert preview == type(preview)("Just a line.", 1, 1, False)


def test_tags_and_commented_code_are_not_headings() -> None:
    body = "#tag at the start\n\n```sh\n# comment\n```\n\n####### seven hashes\n\n# Real"
    preview = make_preview(body, COUNTER)
    assert preview.sections_total == 2
    assert preview.text.startswith("#tag at the start\n\n```sh\n# comment\n```")


def test_long_heading_is_cut_at_a_word() -> None:
    heading = "# " + " ".join(["longword"] * 200)
    preview = make_preview(heading + "\n\nBody.", COUNTER, section_tokens=20)
    first = preview.text.splitlines()[0]
    assert first.endswith(" ...") and COUNTER.count(first) <= 20


def test_section_bodies_stay_within_section_tokens() -> None:
    body = _sections(5, words=300)
    preview = make_preview(body, COUNTER, section_tokens=40)
    for block in preview.text.split("\n\n"):
        assert COUNTER.count(block.split("\n", 1)[1]) <= 40


def test_cut_inside_a_code_block_closes_the_fence() -> None:
    code = "\n".join(f"x{i} = compute({i})" for i in range(200))
    body = f"# Code\n\nSetup first.\n\n~~~~python\n{code}\n~~~~\n\n# After\n\nText."
    preview = make_preview(body, COUNTER, section_tokens=40)
    block = preview.text.split("\n\n# After")[0]
    assert block.endswith("\n~~~~\n...")
    assert preview.text.endswith("# After\nText.")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["# H", "## H", "text", "```", "```py", "more words here."]),
            st.integers(0, 30),
        ),
        max_size=40,
    ),
    st.integers(8, 60),
)
def test_fences_are_never_left_open(lines: list[tuple[str, int]], limit: int) -> None:
    body = "\n".join(kind if kind.startswith("```") else f"{kind} " + "w " * n for kind, n in lines)
    if _fence_open_at_end(body):
        body += "\n```"
    preview = make_preview(body, COUNTER, section_tokens=limit, headless_tokens=limit)
    for block in re.split(r"\n\n(?=#)", preview.text):
        assert not _fence_open_at_end(block), block


def test_preview_is_deterministic() -> None:
    body = _sections(30, words=120)
    first = make_preview(body, TokenCounter())
    second = make_preview(body, TokenCounter())
    assert first == second


def test_one_megabyte_input_is_bounded() -> None:
    """A 1 MB note gives a preview bounded by the section limits (timing not asserted)."""
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    parts: list[str] = []
    while sum(len(p) for p in parts) < 1_000_000:
        n = len(parts)
        prose = " ".join(rng.choice(words) + ("." if rng.random() < 0.1 else "") for _ in range(90))
        parts.append(f"## Section {n}\n\n{prose}\n\n```\ncode {n}\n```\n")
    body = "\n".join(parts)
    preview = make_preview(body, COUNTER, max_sections=20, section_tokens=125)
    assert preview.sections_total == len(parts)
    assert COUNTER.count(preview.text) <= 20 * (125 + 10) + 20
    assert preview.text.endswith(f"[... {len(parts) - 20} more sections omitted ...]")


def test_bad_preview_limits_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max_sections"):
        make_preview("x", COUNTER, max_sections=0)


# --- cut_to_tokens ---------------------------------------------------------------------

CUT_TEXT = (
    "The first paragraph is long enough to be worth keeping on its own\n\n"
    "Second paragraph has a sentence. And more words follow here and there and everywhere."
)


def test_sentence_cut_prefers_a_sentence_end() -> None:
    assert cut_to_tokens(CUT_TEXT, COUNTER, 24, boundary="sentence").endswith("has a sentence.")


def test_paragraph_cut_prefers_a_paragraph_end() -> None:
    cut = cut_to_tokens(CUT_TEXT, COUNTER, 24, boundary="paragraph")
    assert cut == "The first paragraph is long enough to be worth keeping on its own"


def test_word_cut_keeps_whole_words() -> None:
    cut = cut_to_tokens(CUT_TEXT, COUNTER, 24, boundary="word")
    assert cut.endswith(("follow", "here", "and", "there", "words")), cut
    assert CUT_TEXT.startswith(cut) and COUNTER.count(cut) <= 24


def test_sentence_cut_falls_back_to_a_word_without_sentence_ends() -> None:
    text = " ".join(["word"] * 100)
    cut = cut_to_tokens(text, COUNTER, 10, boundary="sentence")
    assert cut == " ".join(["word"] * 10)


def test_text_that_fits_is_returned_unchanged() -> None:
    assert cut_to_tokens("fits  \n", COUNTER, 10) == "fits  \n"


@settings(max_examples=80, deadline=None)
@given(
    st.text(max_size=600), st.integers(1, 80), st.sampled_from(["sentence", "paragraph", "word"])
)
def test_cut_is_a_prefix_within_the_limit(text: str, limit: int, boundary: str) -> None:
    cut = cut_to_tokens(text, COUNTER, limit, boundary=boundary)  # type: ignore[arg-type]
    assert text.startswith(cut)
    assert COUNTER.count(cut) <= limit


# --- make_excerpt ----------------------------------------------------------------------


def test_excerpt_keeps_head_and_tail_with_a_marker() -> None:
    text = "line one\nline two\nline three\n" + "middle words " * 200 + "\nthe last line"
    excerpt = make_excerpt(text, COUNTER, 40)
    assert excerpt.text == (
        "line one\nline two\nline three\n"
        "[... 2602 of 2643 characters cut here (non-recoverable: head and tail kept) ...]\n"
        "the last line"
    )
    assert (excerpt.cut_chars, excerpt.total_chars) == (2602, 2643)


def test_excerpt_of_text_that_fits_is_the_text() -> None:
    excerpt = make_excerpt("short selection", COUNTER, 64)
    assert (excerpt.text, excerpt.cut_chars) == ("short selection", 0)


def test_excerpt_below_the_floor_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        make_excerpt("anything", COUNTER, EXCERPT_MIN_TOKENS - 1)


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(
        st.text(min_size=0, max_size=3000),
        st.lists(st.sampled_from(["word", "word.", "\n", "日本語", "🙂", "  "]), max_size=1500).map(
            " ".join
        ),
    ),
    st.integers(EXCERPT_MIN_TOKENS, 300),
)
def test_excerpt_is_bounded_and_extractive(text: str, limit: int) -> None:
    excerpt = make_excerpt(text, COUNTER, limit)
    assert COUNTER.count(excerpt.text) <= limit
    head = text[: excerpt.head_chars]
    tail = text[len(text) - excerpt.tail_chars :] if excerpt.tail_chars else ""
    assert excerpt.head_chars + excerpt.cut_chars + excerpt.tail_chars == len(text)
    assert excerpt.text.startswith(head) and excerpt.text.endswith(tail)
    if excerpt.cut_chars:
        assert f"[... {excerpt.cut_chars} of {len(text)} characters cut here" in excerpt.text
    else:
        assert excerpt.text == text


def test_excerpt_of_one_megabyte_is_bounded() -> None:
    text = "word " * 200_000 + "the end"
    excerpt = make_excerpt(text, COUNTER, 500)
    assert COUNTER.count(excerpt.text) <= 500
    assert excerpt.text.endswith("the end")
    assert excerpt.head_chars > 0


# Pieces that stress the pre-tokenizer: contractions, digit runs, punctuation that absorbs
# newlines, slashes, tabs, non-ASCII letters and marks, and the ellipsis itself.
_PIECES = st.sampled_from(
    [
        " ",
        "  ",
        "\t",
        "\n",
        "\n\n",
        ".",
        "...",
        "!?",
        "'s",
        "'",
        '"',
        ")",
        "/",
        "-",
        "#",
        "`",
        "123",
        "4567",
        "word",
        "Word",
        "WORD",
        "é",
        "Ω",
        "日本",
        "\u0301",
        "\u3000",
        "\u00a0",
        "\x1c",
        "…",
        "a.b",
        "e.g.",
        "x/y",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    text=st.lists(_PIECES, min_size=4, max_size=80).map("".join),
    limit=st.integers(min_value=1, max_value=24),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_marked_cut_counted_from_the_window_equals_encoding_it(
    text: str, limit: int, name: str
) -> None:
    """Where the cut is counted from the window's tokens, the count is the true one."""
    from lamina.pipeline._views.preview import ELLIPSIS, _token_window, _tokens_up_to

    counter = TokenCounter(name)
    enc = counter.encoding
    found = _token_window(text, counter, limit)
    if found is None:
        assert len(enc.encode_ordinary(text)) <= limit
        return
    chunk, tokens = found
    for pos in range(1, len(chunk)):
        kept = text[:pos].rstrip()
        n_bytes = len(enc.decode_bytes(tokens))
        counted = _tokens_up_to(counter, tokens, len(tokens), n_bytes, text, kept)
        if counted is not None:
            assert counted == len(enc.encode_ordinary(f"{kept} {ELLIPSIS}")), (kept, text)


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(_PIECES, min_size=4, max_size=200).map("".join),
    limit=st.integers(min_value=8, max_value=60),
    boundary=st.sampled_from(["sentence", "paragraph", "line", "word"]),
)
def test_marked_cut_stays_within_its_limit(text: str, limit: int, boundary: str) -> None:
    from lamina.pipeline._views.preview import _cut_with_marker

    out, cut, tokens = _cut_with_marker(text, COUNTER, limit, boundary)  # type: ignore[arg-type]
    assert tokens == COUNTER.count(out)
    if not cut:
        assert out == text and tokens <= limit
    else:
        assert tokens <= limit


_MARKDOWN = st.lists(MARKDOWN_LINE, min_size=1, max_size=60).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(body=_MARKDOWN, limit=st.integers(min_value=8, max_value=40))
def test_preview_reports_its_exact_token_count(body: str, limit: int) -> None:
    preview = make_preview(body, COUNTER, section_tokens=limit, headless_tokens=limit)
    assert preview.tokens in (-1, COUNTER.count(preview.text))


def test_cutting_encodes_through_the_counters_meter() -> None:
    """A cut's windows go through the counter, so ``encoded_chars`` sees what previews cost."""
    counter = TokenCounter()
    text = "A sentence of a note. " * 400
    cut = cut_to_tokens(text, counter, 50)
    assert len(cut) < len(text)
    assert len(cut) <= counter.encoded_chars < len(text)


# Blank lines, trailing blanks and indented headings around sections, where a section's
# text (heading, one newline, trimmed body) and its span of the note differ.
_NOTE_LINE = st.one_of(MARKDOWN_LINE, st.sampled_from(["", "  ", "Ends here.  ", " ## Indented"]))
_NOTE = st.lists(_NOTE_LINE, min_size=1, max_size=40).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(
    body=_NOTE,
    end=st.sampled_from(["", "\n", "\n\n"]),
    limit=st.integers(min_value=8, max_value=120),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_a_preview_counted_from_a_count_by_sections_is_exact(
    body: str, end: str, limit: int, name: str
) -> None:
    """The note's count made at its sections and the preview's made from those parts are
    both what encoding gives."""
    from lamina.pipeline._views.preview import count_by_sections, fitted_preview_of
    from lamina.pipeline.tokens import CountMemo

    counter = TokenCounter(name, memo=CountMemo())
    enc = counter.encoding
    body += end
    text = f'<note key="k" title="T">\n{body}\n</note>'
    assert count_by_sections(text, body, counter) == len(enc.encode_ordinary(text))
    preview = fitted_preview_of(body, counter, limit)
    assert preview.tokens == len(enc.encode_ordinary(preview.text))


def test_a_preview_after_a_count_by_sections_encodes_no_whole_section() -> None:
    """Its sections' counts come from the parts the note's count remembered: what is
    encoded again is the cut section's window and short tails, not the kept sections."""
    from lamina.pipeline._views.preview import count_by_sections, fitted_preview_of
    from lamina.pipeline.tokens import CountMemo

    body = "\n\n".join(
        f"## Part {s}\n\n" + " ".join(f"Sample {s}.{k} was logged." for k in range(40))
        for s in range(8)
    )
    text = f'<note key="k" title="T">\n{body}\n</note>'

    def encoded(first: bool) -> int:
        counter = TokenCounter(memo=CountMemo())
        if first:
            count_by_sections(text, body, counter)
        before = counter.encoded_chars
        preview = fitted_preview_of(body, counter, 1000)
        assert preview.sections_kept == 3 and preview.tokens == COUNTER.count(preview.text)
        return counter.encoded_chars - before

    alone, after = encoded(False), encoded(True)
    assert after < alone // 20


_WORDS = ("sync", "token", "cache", "vault", "retry", "index")


@st.composite
def _sectioned_note(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A note with an optional ``---`` properties header, numbered headings (each one
    unique, so its place in a preview is its place in the note) and embed lines."""
    parts: list[str] = []
    markers: list[str] = []
    if draw(st.booleans()):
        props = draw(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3, unique=True))
        parts.append("---\n" + "\n".join(f"{p}: {p} value" for p in props) + "\n---")
        markers.append("---")
    if draw(st.booleans()):
        parts.append(draw(st.sampled_from(_WORDS)) + " lead text before any heading.")
    for i in range(draw(st.integers(min_value=1, max_value=9))):
        level = draw(st.integers(min_value=1, max_value=3))
        heading = f"{'#' * level} H{i} {draw(st.sampled_from(_WORDS))}"
        markers.append(heading)
        lines = [
            draw(st.sampled_from([*(f"About {w} and more {w}." for w in _WORDS), "![[x#Part]]"]))
            for _ in range(draw(st.integers(min_value=0, max_value=6)))
        ]
        parts.append("\n".join([heading, "", *lines]))
    return "\n\n".join(parts) + "\n", markers


@settings(max_examples=300, deadline=None)
@given(
    note=_sectioned_note(),
    limit=st.integers(min_value=8, max_value=160),
    words=st.frozensets(st.sampled_from(_WORDS), max_size=2),
    changed=st.integers(min_value=0, max_value=9),
)
def test_a_fitted_preview_keeps_document_order(
    note: tuple[str, list[str]], limit: int, words: frozenset[str], changed: int
) -> None:
    """Sections chosen by priority (changed, then named by the query) are shown in the
    note's order: the properties header first, headings in turn."""
    from lamina.pipeline._views.preview import fitted_preview_of

    body, markers = note
    old = body.replace(f"H{changed} ", f"H{changed} old ", 1)
    text = fitted_preview_of(body, COUNTER, limit, words=words, old=old).text
    lines = text.split("\n")
    shown = [m for m in markers if m in lines]
    assert shown == sorted(shown, key=lines.index)
    if "---" in shown:
        assert lines[0] == "---"


@pytest.mark.parametrize(
    ("body", "prose"),
    [
        ('---\ncategories:\n  - "[[Movies]]"\nrating: 7\n---\n', False),
        ("---\ntags: [a]\n---\n# Heading\n\n[... 3 more sections omitted ...]", False),
        ("![[cover.png]]\n[[Other note]]\n## Only headings", False),
        ("---\ntitle: open frontmatter never closed\nmore: props", False),
        ("---\ntags: [a]\n---\nA sentence of prose.", True),
        ("---\n\nA rule, then prose.", True),
        ("See [[Other note]] for the rest.", True),
    ],
)
def test_has_prose_is_the_judges_criterion(body: str, prose: bool) -> None:
    """Frontmatter, headings, embeds and links, and an omitted-sections line are not
    prose: a cut form of only those is never sent."""
    assert has_prose(body) is prose


def test_a_preview_of_a_preview_counts_the_sections_both_cuts_left_out() -> None:
    """A note held only as a preview steps down like one held whole: the preview's
    sections fitted again, one omitted line counting what both cuts left out."""
    note = "# Ships\n\n" + "\n\n".join(
        f"## Part {i}\n\nThe ship {i} sails at dawn. It carries {i} crates of tea. The crew sings."
        for i in range(6)
    )
    preview = fit_preview(note, COUNTER, 80)
    assert preview.endswith("\n\n[... 4 more sections omitted ...]")
    part = "The ship {0} sails at dawn. It carries {0} crates of tea. The crew sings."
    assert refitted_preview(preview, COUNTER, 50) == (
        f"# Ships\n\n## Part 0\n{part.format(0)}\n\n[... 5 more sections omitted ...]"
    )
    assert refitted_preview(preview, COUNTER, 30) == (
        "# Ships\n\n## Part 0\nThe ship 0 sails at dawn. ...\n\n[... 5 more sections omitted ...]"
    )
    assert refitted_preview(preview, COUNTER, 80) == preview
    assert COUNTER.count(refitted_preview(preview, COUNTER, 30)) <= 30


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["# H", "## H", "text"]), st.integers(0, 30)), max_size=12),
    st.integers(64, 400),
    st.integers(32, 400),
)
@example(lines=[("# H", 30), ("text", 23), ("## H", 26)], first=287, second=93)
def test_a_preview_of_a_preview_fits_and_omits_no_fewer_sections(
    lines: list[tuple[str, int]], first: int, second: int
) -> None:
    """Within its limit, one omitted line counting at least what the first cut left out,
    and the preview itself where it fits."""
    body = "\n\n".join(f"{kind} " + "word " * n for kind, n in lines) or "text"
    preview = fit_preview(f"# Title\n\n{body}", COUNTER, first)
    again = refitted_preview(preview, COUNTER, second)
    assert COUNTER.count(again) <= second
    before, after = OMITTED_LINE.findall(preview), OMITTED_LINE.findall(again)
    assert len(after) <= 1
    assert sum(map(int, after)) >= sum(map(int, before))
    if COUNTER.count(preview) <= second:
        assert again == preview
