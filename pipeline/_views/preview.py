"""Deterministic carry-forward forms cut by tokens: structure + preview, and marked excerpts.

Every cut keeps a true prefix (and, for excerpts, a true suffix) of the input, or of a
note's text after its frontmatter when no text past it would fit (a preview never leaves
frontmatter open, nor holds only its omitted-sections line), and moves back to a
sentence, paragraph, line or word end, looking back no further than half of
the limit (the anchor allowed half or 80%; half keeps more text when no boundary is near).
Only the characters near the cut are ever encoded, so a 1 MB input costs what its kept
part costs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Literal

import attrs

from lamina.pipeline._errors import ArgumentError, ConfigError
from lamina.pipeline._text.markdown import (
    FENCE_LINE,
    fence_after,
    section_spans,
    split_sections,
    trim_blank_lines,
)
from lamina.pipeline._tokens.counter import (
    TokenCounter,
    count_joined_from,
    count_with_sep_from,
    starts_piece,
)

__all__ = [
    "ELLIPSIS",
    "EXCERPT_MIN_TOKENS",
    "FRONTMATTER",
    "OMITTED_LINE",
    "Boundary",
    "Excerpt",
    "Preview",
    "count_by_sections",
    "cut_to_tokens",
    "fit_preview",
    "fitted_preview_of",
    "focus_words",
    "frontmatter_end",
    "has_prose",
    "make_excerpt",
    "make_preview",
    "refitted_preview",
]

Boundary = Literal["sentence", "paragraph", "line", "word"]

# ASCII on purpose: one "…" in a preview makes CPython store the whole system message
# (library included) at two bytes per character instead of one.
ELLIPSIS = "..."
FRONTMATTER = "---"
"""The line that opens and closes a note's properties (frontmatter) in its rendered body."""
EXCERPT_MIN_TOKENS = 32
"""Below this an excerpt cannot hold its own marker line, so ``make_excerpt`` refuses."""

# Preferred boundary first; the hard token cut is the last resort of every chain.
_CHAINS: dict[str, tuple[str, ...]] = {
    "sentence": ("sentence", "paragraph", "word"),
    "paragraph": ("paragraph", "sentence", "word"),
    "line": ("line", "word"),
    "word": ("word",),
}
# A cut position p is valid when the regex matches text[:p] at its end (lookbehind) and
# the text continues with whitespace (lookahead), so "3.14" or "e.g.x" never count.
_BOUNDARY_RES: dict[str, re.Pattern[str]] = {
    # Closers: quotes and brackets; \u3002\uff01\uff1f are the CJK full stop, ! and ?.
    "sentence": re.compile(r"(?:(?<=[.!?…])[\"'\u201d\u2019)\]]*(?=\s)|(?<=[\u3002\uff01\uff1f]))"),
    "paragraph": re.compile(r"(?<=\S)[ \t]*(?=\n[ \t]*\n)"),
    "line": re.compile(r"(?<=[^\n])(?=\n)"),
    "word": re.compile(r"(?<=\S)(?=\s)"),
}
_LINE_START = re.compile(r"(?<=\n)")
_WORD_START = re.compile(r"(?<=\s)(?=\S)")


@attrs.frozen
class Preview:
    """A structure + preview form: headings kept, section bodies cut, dropped sections counted."""

    text: str
    sections_total: int
    sections_kept: int
    cut: bool
    tokens: int = attrs.field(default=-1, eq=False)
    """Exact token count of ``text`` (made from the sections' counts), -1 if not known."""
    blocks: tuple[tuple[int, int], ...] = attrs.field(default=(), eq=False, repr=False)
    """The blank-line separated blocks ``text`` is made of: (characters, exact tokens)."""


@attrs.frozen
class Excerpt:
    """An extractive excerpt of non-recoverable text: head and tail kept, middle marked as cut.

    ``text[:head_chars]`` and the input's last ``tail_chars`` characters appear verbatim;
    ``head_chars + cut_chars + tail_chars == total_chars``.
    """

    text: str
    cut_chars: int
    total_chars: int
    head_chars: int
    tail_chars: int


def _count(counter: TokenCounter, text: str) -> int:
    """A one-off count (a candidate cut), encoded through the counter so its meter sees it."""
    return counter.count_once(text)


def _small(counter: TokenCounter) -> Callable[[str], int]:
    """Counts of separators and punctuation tails, asked for again and again: remembered
    (in the counter's memo, and by the text itself while this function lives)."""
    seen: dict[str, int] = {}

    def count(text: str) -> int:
        n = seen.get(text)
        if n is None:
            if len(text) > 16:
                return counter.count_once(text)
            n = seen[text] = counter.count(text)
        return n

    return count


def _surely_fits(text: str, max_tokens: int) -> bool:
    """True when ``text`` cannot exceed ``max_tokens``: a token is at least one UTF-8 byte."""
    return len(text) <= max_tokens // 4 or (
        len(text) <= max_tokens and len(text.encode("utf-8")) <= max_tokens
    )


def _token_window(
    text: str, counter: TokenCounter, max_tokens: int
) -> tuple[str, list[int]] | None:
    """A leading chunk of ``text`` with more than ``max_tokens`` tokens, and its tokens;
    None when the whole text fits. Encodes a growing window, never a long input whole."""
    if _surely_fits(text, max_tokens):
        return None
    chunk, tokens = _window_tokens(text, counter, max_tokens)
    return (chunk, tokens) if len(tokens) > max_tokens else None


def _window_tokens(text: str, counter: TokenCounter, max_tokens: int) -> tuple[str, list[int]]:
    """The shortest window (growing from about ``max_tokens`` tokens) that holds more than
    ``max_tokens`` tokens, and its tokens; the whole text and its tokens if it fits."""
    window = max_tokens * 4 + 64
    while True:
        chunk = text[:window]
        tokens = counter.encode(chunk)
        if len(tokens) > max_tokens or len(chunk) == len(text):
            return chunk, tokens
        # Grow to where max_tokens should end at this chunk's characters per token.
        window = max(window + 64, len(chunk) * (max_tokens + 16) // max(len(tokens), 1))


def _token_prefix(chunk: str, counter: TokenCounter, tokens: list[int], n: int) -> tuple[str, int]:
    """The characters of ``chunk`` that its first ``n`` tokens cover (a partial one dropped),
    and those tokens' byte length."""
    raw = counter.encoding.decode_bytes(tokens[:n])
    return chunk[: len(raw.decode("utf-8", errors="ignore"))], len(raw)


def _hard_prefix(text: str, counter: TokenCounter, max_tokens: int) -> str:
    """A prefix of ``text`` with at most ``max_tokens`` tokens, ``text`` itself if it fits."""
    if max_tokens <= 0 or not text:
        return ""
    found = _token_window(text, counter, max_tokens)
    if found is None:
        return text
    chunk, tokens = found
    prefix = _token_prefix(chunk, counter, tokens, max_tokens)[0]
    while prefix and _count(counter, prefix) > max_tokens:
        prefix = prefix[: len(prefix) - max(1, len(prefix) // 64)]
    return prefix


def _hard_suffix(text: str, counter: TokenCounter, max_tokens: int) -> str:
    """A suffix of ``text`` with at most ``max_tokens`` tokens, ``text`` itself if it fits."""
    if max_tokens <= 0 or not text:
        return ""
    window = max_tokens * 4 + 64
    while True:
        chunk = text[-window:]
        tokens = counter.encode(chunk)
        if len(tokens) <= max_tokens:
            if len(chunk) == len(text):
                return text
            window *= 2
            continue
        raw = counter.encoding.decode_bytes(tokens[-max_tokens:])
        decoded = raw.decode("utf-8", errors="ignore")
        suffix = chunk[len(chunk) - len(decoded) :] if decoded else ""
        while suffix and _count(counter, suffix) > max_tokens:
            suffix = suffix[max(1, len(suffix) // 64) :]
        return suffix


def _last_boundary(text: str, end: int, kind: str) -> int | None:
    """The last cut position of ``kind`` in [end // 2, end], judged against the full text."""
    lo = end // 2
    region = text[max(0, lo - 1) : end + 64]
    offset = max(0, lo - 1)
    best: int | None = None
    for m in _BOUNDARY_RES[kind].finditer(region):
        pos = offset + m.end()
        if lo <= pos <= end and pos > 0:
            best = pos
    return best


def _boundary_before(text: str, end: int, boundary: Boundary) -> int:
    """The last ``boundary`` cut (falling back along its chain) in [end // 2, end], else end."""
    if boundary not in _CHAINS:
        raise ArgumentError("boundary", f"unknown {boundary!r} (known: {', '.join(_CHAINS)})")
    for kind in _CHAINS[boundary]:
        pos = _last_boundary(text, end, kind)
        if pos is not None:
            return pos
    return end


def _cut_position(text: str, counter: TokenCounter, max_tokens: int, boundary: Boundary) -> int:
    """Where to cut ``text`` so the prefix has at most ``max_tokens`` tokens (len if it fits)."""
    if boundary not in _CHAINS:
        raise ArgumentError("boundary", f"unknown {boundary!r} (known: {', '.join(_CHAINS)})")
    hard = _hard_prefix(text, counter, max_tokens)
    if len(hard) == len(text):
        return len(text)
    return _boundary_before(text, len(hard), boundary)


def cut_to_tokens(
    text: str, counter: TokenCounter, max_tokens: int, *, boundary: Boundary = "sentence"
) -> str:
    """The longest prefix of ``text`` within ``max_tokens`` that ends at ``boundary``.

    Falls back along sentence -> paragraph -> word (or paragraph -> sentence -> word,
    line -> word), then to a plain token cut, never looking back more than half the kept
    length. Returns ``text`` unchanged when it fits; a cut prefix has trailing blanks removed.
    """
    pos = _cut_position(text, counter, max_tokens, boundary)
    if pos == len(text):
        return text
    return text[:pos].rstrip()


def _open_fence(text: str) -> str | None:
    """The fence string (for example "```") left open at the end of ``text``, if any."""
    opener: str | None = None
    for m in FENCE_LINE.finditer(text):
        opener = fence_after(opener, m.group(1), m.group(2))
    return opener


def _tokens_up_to(
    counter: TokenCounter, tokens: list[int], n: int, n_bytes: int, text: str, kept: str
) -> int | None:
    """Exact count of ``kept + " ..."`` from the window's first ``n`` tokens (``n_bytes``
    long), without encoding it.

    ``kept`` is a prefix of the window that starts and ends with a non-blank and is
    followed by a space or a tab. No pre-tokenizer piece of o200k or cl100k crosses such a
    point (a piece takes a space only as its first character), so kept's pieces, hence its
    tokens, are the window's up to there, and " ..." is a piece of its own. None otherwise,
    or if the point falls inside a token (then the caller counts).
    """
    if not kept or kept[0].isspace() or text[len(kept)] not in " \t":
        return None
    size = len(kept.encode("utf-8", "surrogatepass"))
    while n_bytes > size and n > 0:
        n -= 1
        n_bytes -= len(counter.encoding.decode_single_token_bytes(tokens[n]))
    if n_bytes != size:
        return None
    return n + counter.count(" " + ELLIPSIS)


def _cut_with_marker(
    text: str, counter: TokenCounter, max_tokens: int, boundary: Boundary
) -> tuple[str, bool, int]:
    """``text`` if it fits; else a cut prefix, any open fence closed, and an ellipsis; and the
    result's exact token count.

    One encode of a window of about ``max_tokens`` tokens decides the cut; the marked
    result is counted from that window's tokens when the cut allows it (see
    ``_tokens_up_to``), else encoded once more.
    """
    chunk, tokens = _window_tokens(text, counter, max_tokens) if max_tokens > 0 else (text, [])
    if len(tokens) <= max_tokens and len(chunk) == len(text) and max_tokens > 0:
        return text, False, len(tokens)
    limit = max_tokens
    while True:
        hard, hard_bytes = _token_prefix(chunk, counter, tokens, max(limit, 0))
        kept = text[: _boundary_before(text, len(hard), boundary)].rstrip()
        fence = _open_fence(kept)
        counted = None
        if fence:
            out = f"{kept}\n{fence}\n{ELLIPSIS}"
        elif FENCE_LINE.fullmatch(kept.rsplit("\n", 1)[-1]):  # "``` ..." would reopen it
            out = f"{kept}\n{ELLIPSIS}"
        else:
            out = f"{kept} {ELLIPSIS}".lstrip()
            counted = _tokens_up_to(counter, tokens, max(limit, 0), hard_bytes, text, kept)
        n = _count(counter, out) if counted is None else counted
        if n <= max_tokens or limit <= 1:
            return out, True, n
        limit = max(limit - (n - max_tokens), 1)


def frontmatter_end(text: str) -> int:
    """Where the frontmatter block that opens ``text`` (a ``---`` line, properties, a
    closing ``---`` line) ends, after its closing line; 0 when ``text`` opens none (a
    ``---`` line followed by a blank line is a rule), or never closes the one it opens."""
    if not text.startswith(FRONTMATTER + "\n") or text.startswith("\n", len(FRONTMATTER) + 1):
        return 0  # none, or a rule (a blank line follows it)
    close = text.find("\n" + FRONTMATTER, len(FRONTMATTER))
    while close != -1:
        end = close + 1 + len(FRONTMATTER)
        if end == len(text) or text[end] == "\n":
            return end
        close = text.find("\n" + FRONTMATTER, end)
    return 0


def _cut_note_text(
    text: str, counter: TokenCounter, max_tokens: int, boundary: Boundary
) -> tuple[str, bool, int]:
    """``_cut_with_marker`` of a section that may open with frontmatter, never leaving it
    open: a cut that keeps no text past the frontmatter starts after it instead (its text
    cut to ``max_tokens``); properties alone are cut at a line and closed again."""
    out, cut, n = _cut_with_marker(text, counter, max_tokens, boundary)
    end = frontmatter_end(text)
    if not cut or not end or out[end:].replace(ELLIPSIS, "").strip():
        return out, cut, n
    rest = trim_blank_lines(text[end:])
    if rest:
        out, _, n = _cut_with_marker(rest, counter, max_tokens, boundary)
        return out, True, n
    fences = _count(counter, f"{FRONTMATTER}\n\n{FRONTMATTER}")
    inner = text[len(FRONTMATTER) + 1 : end - len(FRONTMATTER) - 1]
    kept = _cut_with_marker(inner, counter, max(max_tokens - fences, 1), "line")[0]
    closed = f"{FRONTMATTER}\n{kept}\n{FRONTMATTER}"
    return closed, True, _count(counter, closed)


OMITTED_LINE = re.compile(r"\[\.\.\. (\d+) more sections? omitted \.\.\.\]")
"""The line that counts the sections a preview left out (``_omitted_line``); its group,
that count."""


def _omitted_line(n: int) -> str:
    return f"[... {n} more section{'s' if n != 1 else ''} omitted ...]"


_EMBED_OR_LINK = re.compile(r"!?\[\[[^\]]*\]\]|!\[[^\]]*\]\([^)]*\)")
_LETTER = re.compile(r"[^\W\d_]")


def has_prose(body: str) -> bool:
    """Whether ``body`` holds a line of prose: a line with a letter that is not a heading,
    frontmatter (a leading block fenced by ``---``, or one never closed), an
    omitted-sections line, or only embeds and wiki links. A cut form without any tells
    the model nothing its title does not, so the budget never sends one."""
    lines = body.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    if len(lines) > 1 and lines[0].strip() == FRONTMATTER and lines[1].strip():
        closing = next(
            (i for i, line in enumerate(lines[1:], 1) if line.strip() == FRONTMATTER), None
        )
        lines = lines[closing + 1 :] if closing is not None else []
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#") or OMITTED_LINE.fullmatch(text):
            continue
        if _LETTER.search(_EMBED_OR_LINK.sub("", text)):
            return True
    return False


def make_preview(
    body: str,
    counter: TokenCounter,
    *,
    max_sections: int = 20,
    section_tokens: int = 125,
    headless_tokens: int = 500,
) -> Preview:
    """Structure + preview of a markdown body, the L2 carry-forward form of large recoverable items.

    Splits at ATX headings (outside fences); keeps the first ``max_sections`` sections, each
    body cut to ``section_tokens`` at a sentence/paragraph/word end with an ellipsis (headings
    longer than that are cut at a word); counts dropped sections. A body without headings
    keeps its first ``headless_tokens`` tokens the same way.
    """
    if max_sections < 1 or section_tokens < 8 or headless_tokens < 8:
        raise ConfigError(
            "preview",
            f"max_sections must be >= 1 and token limits >= 8, got {max_sections}, "
            f"{section_tokens}, {headless_tokens}",
        )
    sections = split_sections(body)
    if sections[0][0] is None and len(sections) == 1:
        text, cut, n = _cut_note_text(trim_blank_lines(body), counter, headless_tokens, "sentence")
        return Preview(text, 1, 1, cut, n, ((len(text), n),))
    kept = sections[:max_sections]
    dropped = len(sections) - len(kept)
    blocks: list[tuple[str, int | None]] = []
    any_cut = dropped > 0
    for heading, section_body in kept:
        lines: list[tuple[str, int]] = []
        if heading is not None:
            head, head_cut, n = _cut_with_marker(heading, counter, section_tokens, "word")
            lines.append((head, n))
            any_cut = any_cut or head_cut
        trimmed = trim_blank_lines(section_body)
        if trimmed:
            text, cut, n = _cut_note_text(trimmed, counter, section_tokens, "sentence")
            lines.append((text, n))
            any_cut = any_cut or cut
        blocks.append(_joined_count(lines, "\n", counter))
    if dropped:
        line = _omitted_line(dropped)
        blocks.append((line, _count(counter, line)))
    parts = [(b, -1 if k is None else k) for b, k in blocks]
    text, total = _joined_count(parts, "\n\n", counter)
    known = tuple((len(b), k) for b, k in parts) if total is not None else ()
    return Preview(text, len(sections), len(kept), any_cut, -1 if total is None else total, known)


def _joined_count(
    parts: list[tuple[str, int]], sep: str, counter: TokenCounter
) -> tuple[str, int | None]:
    """``sep.join`` of the (text, count) parts and its exact count made from theirs (a count
    of -1 is unknown), or None when the pieces do not add up (see ``count_joined_from``)."""
    text = sep.join(t for t, _ in parts)
    if any(n < 0 for _, n in parts):
        return text, None
    return text, count_joined_from(parts, sep, _small(counter))


def _excerpt_marker(cut: int, total: int) -> str:
    return f"[... {cut} of {total} characters cut here (non-recoverable: head and tail kept) ...]"


def _first_boundary(text: str, start: int, kinds: tuple[str, ...]) -> int:
    """The first line start, else word start, in [start, start + half the rest], else start."""
    if start == 0 or text[start - 1] == "\n":
        return start
    hi = start + (len(text) - start) // 2
    for kind in kinds:
        m = (_LINE_START if kind == "line" else _WORD_START).search(text, start, hi + 1)
        if m is not None:
            return m.start()
    return start


def make_excerpt(text: str, counter: TokenCounter, max_tokens: int) -> Excerpt:
    """A bounded extractive excerpt: head (about 2/3) and tail (1/3) kept, a marker line between.

    The result, marker included, has at most ``max_tokens`` tokens; nothing is paraphrased.
    ``max_tokens`` below ``EXCERPT_MIN_TOKENS`` raises ``ValueError``.
    """
    if max_tokens < EXCERPT_MIN_TOKENS:
        raise ArgumentError("max_tokens", f"must be >= {EXCERPT_MIN_TOKENS}, got {max_tokens}")
    total = len(text)
    if len(_hard_prefix(text, counter, max_tokens)) == total:
        return Excerpt(text, 0, total, total, 0)
    budget = max_tokens - _count(counter, _excerpt_marker(total, total)) - 2
    while True:
        head_budget = max(budget, 0) * 2 // 3
        tail_budget = max(budget, 0) - head_budget
        head_end = _cut_position(text, counter, head_budget, "line") if head_budget else 0
        suffix = _hard_suffix(text, counter, tail_budget)
        tail_start = _first_boundary(text, total - len(suffix), ("line", "word"))
        if not suffix:
            tail_start = total
        tail_start = max(tail_start, head_end)
        head, tail = text[:head_end], text[tail_start:]
        cut = tail_start - head_end
        out = "\n".join(part for part in (head, _excerpt_marker(cut, total), tail) if part)
        excess = _count(counter, out) - max_tokens
        if excess <= 0 or budget <= 0:
            return Excerpt(out, cut, total, head_end, total - tail_start)
        budget -= excess


_WORD = re.compile(r"[^\W_]{3,}")
_STOP = frozenset(
    {
        "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was",
        "one", "our", "out", "has", "him", "his", "how", "its", "may", "new", "now", "see", "two",
        "who", "did", "get", "let", "put", "say", "she", "too", "use", "what", "when", "where",
        "which", "while", "with", "this", "that", "from", "have", "will", "your", "they", "them",
        "then", "than", "there", "these", "those", "into", "about", "does", "some", "more", "most",
        "such", "only", "also", "just", "over", "very", "here", "why", "changed", "change",
    }
)


@functools.lru_cache(maxsize=64)
def focus_words(text: str) -> frozenset[str]:
    """The words of a query a preview should favour: lower-cased, 3+ letters, no stop words."""
    return frozenset(w for w in (m.lower() for m in _WORD.findall(text)) if w not in _STOP)


def _section_text(heading: str | None, body: str) -> str:
    trimmed = trim_blank_lines(body)
    return "\n".join(t for t in (heading, trimmed) if t)


def _priority(heading: str | None, body: str, words: frozenset[str], changed: bool) -> int:
    """0 for a changed section, 1 for one whose heading names a query word, 2 for one whose
    text does, 3 for the rest (document order breaks ties)."""
    if changed:
        return 0
    if not words:
        return 3
    if heading is not None and _names_any(heading, words):
        return 1
    return 2 if _names_any(body, words) else 3


def _names_any(text: str, words: frozenset[str]) -> bool:
    """Whether one of ``text``'s ``focus_words`` is in ``words``. A word can only be one if
    it is a substring of the lower-cased text, which rules most texts out without a scan
    (but a capital sigma, whose lower case depends on what follows it)."""
    if "\u03a3" not in text:
        low = text.lower()
        if not any(w in low for w in words):
            return False
    return not words.isdisjoint(map(str.lower, _WORD.findall(text)))


def fit_preview(
    body: str,
    counter: TokenCounter,
    max_tokens: int,
    *,
    words: frozenset[str] = frozenset(),
    old: str | None = None,
) -> str:
    """A preview of ``body`` of at most ``max_tokens`` tokens that keeps what the turn is about.

    Sections (split at headings outside fences) are chosen whole in priority order (those
    that differ from ``old``, the version the model saw before; then those whose heading,
    then whose text, holds one of ``words``; then document order) while they fit; the next
    one is cut at a sentence end to fill the rest; the others are counted in a last line.
    The chosen sections are shown in document order. A preview holds text: properties
    (frontmatter) or a bare heading that do not fit whole are left out, when they alone
    would be chosen the text takes their room, and a section cut where only its heading
    would fit shows the start of its text instead. Deterministic; any ``max_tokens``
    gives a preview, so sizes step finely.
    """
    return fitted_preview_of(body, counter, max_tokens, words=words, old=old).text


def section_cuts(body: str) -> list[int]:
    """Where ``body``'s sections start: the points ``count_by_sections`` cuts a note at."""
    return [start for _, _, (start, _) in section_spans(body)]


def count_by_sections(text: str, body: str, counter: TokenCounter) -> int:
    """Exact count of ``text``, a rendering ``head line, body, last line`` of ``body``, cut
    where its sections start (``TokenCounter.count_cut``): a preview of ``body`` fitted
    later counts its sections from those parts (``_section_tokens``), not again."""
    start = text.find("\n") + 1
    end = start + len(body)
    if start == 0 or text[start:end] != body:  # the renderer changed it: counted whole
        return counter.count(text)
    return counter.count_cut(text, [start, *(start + c for c in section_cuts(body)), end + 1])


def _section_tokens(
    body: str,
    heading: str | None,
    span: tuple[int, int],
    text: str,
    counter: TokenCounter,
    small: Callable[[str], int],
) -> int:
    """Exact count of a section's ``text`` (heading, one newline, trimmed body) from the
    count of its span of ``body``, which ``count_by_sections`` remembered: the two differ
    only in newlines after the heading and at the end, where a new piece starts or the
    tail decides (the one piece rule, ``count_with_sep_from``), so only short tails are
    counted again."""
    # The last section is followed by the newline before the rendering's last line.
    raw = body[span[0] : span[1]] + ("\n" if span[1] == len(body) else "")
    core = raw.rstrip("\n")
    trail = raw[len(core) :]
    if core == text:
        n = counter.count(raw) if trail else None
        tail = count_with_sep_from(text, 0, trail, small) if trail else 0
        return counter.count(text) if n is None or tail is None else n - tail
    if heading is None or not text.startswith(heading + "\n"):
        return counter.count(text)
    rest = text[len(heading) + 1 :]  # the trimmed section body, after one newline
    newlines = len(core) - len(heading) - len(rest)
    if not (
        newlines > 1
        and core[len(heading) : len(heading) + newlines] == "\n" * newlines
        and core.startswith(heading)
        and core.endswith(rest)
        and starts_piece(rest)
    ):
        return counter.count(text)
    tail = count_with_sep_from(rest, 0, trail, small) if trail else 0
    if tail is None:
        return counter.count(text)
    return counter.count(raw) - tail - _newlines_gap(heading, newlines, counter, small)


def _newlines_gap(
    heading: str, newlines: int, counter: TokenCounter, small: Callable[[str], int]
) -> int:
    """How many more tokens ``heading`` followed by ``newlines`` newlines has than followed
    by one: from its tail when that decides it (``count_with_sep_from``), else counted."""
    more = count_with_sep_from(heading, 0, "\n" * newlines, small)
    one = count_with_sep_from(heading, 0, "\n", small)
    if more is None or one is None:
        return counter.count(heading + "\n" * newlines) - counter.count(heading + "\n")
    return more - one


def _bare(section: str) -> bool:
    """A section of properties and headings only (no line of text)."""
    rest = section[frontmatter_end(section) :]
    return all(not line.strip() or line.startswith("#") for line in rest.split("\n"))


_Span = tuple[str | None, str, tuple[int, int]]


@functools.lru_cache(maxsize=64)
def _ranked_sections(
    body: str, words: frozenset[str], old: str | None
) -> tuple[tuple[_Span, ...], tuple[str, ...], tuple[int, ...], tuple[bool, ...]]:
    """``body``'s sections with text or a heading (their spans), each one's text, the order
    a preview takes them in (``_priority``, then document order) and which hold no line of
    text: the same for every size a note is fitted to (a budget fits one to several)."""
    spans = tuple((h, b, at) for h, b, at in section_spans(body) if h is not None or b.strip())
    seen = {_section_text(h, b) for h, b in split_sections(old)} if old is not None else None
    texts = tuple(_section_text(h, b) for h, b, _ in spans)
    order = sorted(
        range(len(spans)),
        key=lambda i: (
            _priority(spans[i][0], spans[i][1], words, seen is not None and texts[i] not in seen),
            i,
        ),
    )
    return spans, texts, tuple(order), tuple(_bare(t) for t in texts)


def fitted_preview_of(
    body: str,
    counter: TokenCounter,
    max_tokens: int,
    *,
    words: frozenset[str] = frozenset(),
    old: str | None = None,
    omitted: int = 0,
) -> Preview:
    """``fit_preview`` with its exact token count and blocks, made from the sections' counts
    (the whole preview is encoded only when the pieces may not add up). ``omitted``:
    sections an earlier cut left out of ``body``, counted in the omitted line too."""
    spans, texts, order, bare = _ranked_sections(body, words, old)
    sections = [(h, b) for h, b, _ in spans]
    small = _small(counter)
    budget = max_tokens
    while True:
        picked: list[tuple[int, str, int]] = []
        left = budget - small(_omitted_line(len(sections) + omitted))
        cut = False
        for i in order:
            n = _section_tokens(body, spans[i][0], spans[i][2], texts[i], counter, small)
            if n + 2 <= left:
                picked.append((i, texts[i], n))
                left -= n + 2
                continue
            if bare[i] and not all(bare):
                continue  # properties or a heading that do not fit give way to text
            if left < 16 and all(bare[j] for j, _, _ in picked):
                # Nothing but properties and headings (or nothing) chosen: a preview holds
                # text, not only those and its omitted line, so the text takes their room.
                left += sum(k + 2 for _, _, k in picked)
                picked = []
            if left >= 16 or not picked:
                room = max(left, 16) - 2
                text, cut, k = _cut_note_text(texts[i], counter, room, "sentence")
                if sections[i][0] is not None and _bare(text):  # room for its heading only
                    body_text = trim_blank_lines(sections[i][1])
                    text, cut, k = _cut_note_text(body_text, counter, room, "sentence")
                picked.append((i, text, k))
            break
        # Chosen by priority, shown in document order (properties first, headings in turn).
        chosen = [(text, n) for _, text, n in sorted(picked)]
        kept = len(chosen)
        if kept < len(sections) or omitted:
            line = _omitted_line(len(sections) - kept + omitted)
            chosen.append((line, small(line)))
        out = "\n\n".join(t for t, _ in chosen)
        total = count_joined_from(chosen, "\n\n", small)
        blocks = tuple((len(t), n) for t, n in chosen)
        if total is None:
            total, blocks = counter.count(out), ()
        excess = total - max_tokens
        if excess <= 0 or budget <= 1:
            return Preview(out, len(sections), kept, cut or kept < len(sections), total, blocks)
        budget -= excess


def refitted_preview(preview: str, counter: TokenCounter, max_tokens: int) -> str:
    """A preview of ``preview`` (itself a preview of a note) of at most ``max_tokens``
    tokens: its sections fitted as ``fit_preview`` fits a note's, and one omitted line
    counting the sections both cuts left out; ``preview`` itself where it fits. A note
    held only as a preview (the form it was first sent in) steps down in fine sizes like
    one held whole."""
    # Counted through the memo: the budget asks for one preview at each halving size.
    if counter.count(preview) <= max_tokens:
        return preview
    lines = preview.rsplit("\n\n", 1)
    omitted = OMITTED_LINE.fullmatch(lines[-1]) if len(lines) == 2 else None
    if omitted is None:
        return fit_preview(preview, counter, max_tokens)
    return fitted_preview_of(lines[0], counter, max_tokens, omitted=int(omitted.group(1))).text
