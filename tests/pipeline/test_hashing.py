"""Text hashes are xxh3-128 of the UTF-8 bytes, however the text is fed (pipeline._hashing)."""

from __future__ import annotations

import pytest
import xxhash

from lamina.pipeline._hashing import joined_hash, slice_hash, text_hash


def _reference(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("size", [0, 5, 1024, 1025, 5000, (1 << 20) + 7, 3 << 20])
def test_text_and_slice_hashes_equal_hashing_the_bytes(size: int) -> None:
    text = ("aé漢\ud800x" * (size // 5 + 1))[:size]
    assert text_hash(text) == _reference(text)
    assert slice_hash("ab" + text + "cd", 2, 2 + size) == _reference(text)


def test_joined_hash_skips_empty_texts_like_the_join_does() -> None:
    assert joined_hash(["a", "", "b" * 2_000_000], "\n\n") == _reference("a\n\n" + "b" * 2_000_000)
