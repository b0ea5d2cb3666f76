"""OpenAI messages and request-prefix comparisons."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import lamina.renderers._openai as openai_module
from lamina.pipeline.tokens import TokenCounter, get_encoding
from lamina.renderers import ChatMessage, chatml, common_prefix_length, common_prefix_tokens


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.lists(st.integers(0, 3), max_size=9000),
    a=st.lists(st.integers(0, 3), max_size=50),
    b=st.lists(st.integers(0, 3), max_size=50),
)
def test_common_prefix_length_matches_a_plain_loop(
    prefix: list[int], a: list[int], b: list[int]
) -> None:
    left, right = prefix + a, prefix + b
    expected = 0
    for x, y in zip(left, right, strict=False):
        if x != y:
            break
        expected += 1
    assert common_prefix_length(left, right) == expected
    assert common_prefix_length(bytes(left), bytes(right)) == expected


_BLOCK = st.lists(
    st.sampled_from(
        ["<note>", "</note>", "\n", "\n\n", " ", "word", "Word", ".", "...", "/x", "12", "é", "\t"]
    ),
    min_size=1,
    max_size=12,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    blocks=st.lists(_BLOCK, min_size=1, max_size=12),
    added=st.lists(_BLOCK, max_size=3),
    edit=st.one_of(st.none(), st.tuples(st.integers(0, 400), _BLOCK)),
    margin=st.sampled_from([1, 4, 16, 512]),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_common_prefix_tokens_equals_comparing_the_encoded_requests(
    blocks: list[str],
    added: list[str],
    edit: tuple[int, str] | None,
    margin: int,
    name: str,
) -> None:
    """Counted from shared blocks and small windows, the answer is the whole comparison's."""
    system = "\n\n".join(blocks)
    grown = "\n\n".join([*blocks, *added])
    if edit is not None:
        at = min(edit[0], len(grown))
        grown = grown[:at] + edit[1] + grown[at:]
    previous: list[ChatMessage] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "q1"},
    ]
    current: list[ChatMessage] = [
        {"role": "system", "content": grown},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]
    counter = TokenCounter(name)
    enc = get_encoding(name)
    expected = common_prefix_length(
        enc.encode_ordinary(chatml(previous)), enc.encode_ordinary(chatml(current))
    )
    with mock.patch.object(openai_module, "_MARGIN", margin):
        assert common_prefix_tokens(previous, current, counter) == expected
        assert common_prefix_tokens(previous, current, counter) == expected  # remembered
