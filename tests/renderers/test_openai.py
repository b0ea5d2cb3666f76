"""OpenAI messages and request-prefix comparisons."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from renderers import common_prefix_length


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
