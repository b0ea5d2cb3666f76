"""The one piece rule (``starts_piece``, ``next_piece_start`` in pipeline/_tokens/counter.py),
tested once at its owner against every encoding the counter knows: after a newline, a text
the rule admits starts a new pre-tokenizer piece, so tokens add up across that point."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.pipeline._tokens.counter import starts_piece
from lamina.pipeline._tokens.open_encodings import OPEN_SPECS
from lamina.pipeline.errors import TokenizerUnavailable
from lamina.pipeline.layout import next_piece_start
from lamina.pipeline.tokens import TOKENIZERS, get_encoding

# Whitespace of every kind (the old copies disagreed on \r, form feed and no-break space),
# slashes, punctuation that absorbs newlines, contractions, digits, marks and wide text.
_ALPHABET = st.sampled_from(
    [*"ab Z7/.'s\n\r\t\f\v\x85\xa0\u2028\u3000é\u0301漢", "😀", "'re", "//", "\r\n", "...", "ß"]
)
_TEXT = st.lists(_ALPHABET, max_size=12).map("".join)


def _available(name: str) -> bool:
    spec = OPEN_SPECS.get(name)
    return spec is None or importlib.util.find_spec(spec.package) is not None


_ENCODINGS = [
    pytest.param(
        name, marks=pytest.mark.skipif(not _available(name), reason=f"{name}'s extra missing")
    )
    for name in TOKENIZERS
]


@pytest.mark.parametrize("name", _ENCODINGS)
@settings(max_examples=100, deadline=None)
@given(head=_TEXT, tail=_TEXT)
def test_a_text_the_rule_admits_starts_a_new_piece_after_a_newline(
    name: str, head: str, tail: str
) -> None:
    try:
        enc = get_encoding(name)
    except TokenizerUnavailable:  # pragma: no cover - the extra is declared above
        pytest.skip(f"{name} unavailable")
    if starts_piece(tail):
        joined = enc.encode_ordinary(head + "\n" + tail)
        assert joined == enc.encode_ordinary(head + "\n") + enc.encode_ordinary(tail)


@pytest.mark.parametrize(
    ("tail", "admitted"),
    [("x", True), ("<", True), ("", False), ("/x", False), (" x", False), ("\tx", False),
     ("\rx", False), ("\fx", False), ("\xa0x", False), ("\nx", False), ("\u3000x", False)],
)  # fmt: skip
def test_whitespace_of_every_kind_and_a_slash_start_no_piece(tail: str, admitted: bool) -> None:
    assert starts_piece(tail) is admitted


@given(text=_TEXT, at=st.integers(0, 14))
def test_next_piece_start_is_the_first_admitted_line_start(text: str, at: int) -> None:
    at = min(at, len(text))
    starts = [i + 1 for i, c in enumerate(text) if c == "\n" and i >= at]
    expected = next((p for p in starts if starts_piece(text[p:])), len(text))
    assert next_piece_start(text, at) == expected


def test_the_rule_is_needed_for_the_characters_it_refuses() -> None:
    """A slash, \\r, space, tab or newline after a newline can join its piece (the rule
    is no looser than the encodings; it is as strict for every kind of whitespace)."""
    enc = get_encoding("o200k_base")
    for head, tail in (("a.", "/b"), ("a", "\r\n"), ("a", " \n"), ("a", "\t\n"), ("a", "\nb")):
        joined = enc.encode_ordinary(head + "\n" + tail)
        assert joined != enc.encode_ordinary(head + "\n") + enc.encode_ordinary(tail)
