"""Canonical bytes and xxh3-128 hashes: the only identity Lamina uses."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

import cattrs
import xxhash

__all__ = [
    "canonical_bytes",
    "content_hash",
    "feed",
    "hash_joined",
    "joined_hash",
    "slice_hash",
    "text_hash",
]

_converter = cattrs.Converter()


def canonical_bytes(value: Any) -> bytes:
    """Unstructure ``value`` with cattrs and encode it as sorted, compact UTF-8 JSON."""
    plain = _converter.unstructure(value)
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def content_hash(value: Any) -> str:
    """xxh3-128 hex of the canonical bytes of ``value``."""
    return xxhash.xxh3_128_hexdigest(canonical_bytes(value))


_CHUNK = 1 << 13


def feed(hasher: xxhash.xxh3_128, text: str, start: int = 0, stop: int | None = None) -> None:
    """Feed ``text[start:stop]`` as UTF-8 to ``hasher`` 8 K characters at a time, so hashing a
    whole request never holds a second copy of it as bytes."""
    stop = len(text) if stop is None else stop
    for at in range(start, stop, _CHUNK):
        hasher.update(text[at : min(at + _CHUNK, stop)].encode("utf-8", "surrogatepass"))


def hash_joined(hasher: xxhash.xxh3_128, texts: Iterable[str], sep: str) -> xxhash.xxh3_128:
    """Feed ``sep.join(texts)`` (empty texts skipped) to ``hasher``."""
    first = True
    for text in texts:
        if not text:
            continue
        if not first:
            feed(hasher, sep)
        first = False
        feed(hasher, text)
    return hasher


def joined_hash(texts: Iterable[str], sep: str) -> str:
    """``text_hash(sep.join(texts))`` without making the joined text (empty texts skipped)."""
    return hash_joined(xxhash.xxh3_128(), texts, sep).hexdigest()


_SHORT = 1024


@functools.lru_cache(maxsize=2048)
def _short_hash(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def text_hash(text: str) -> str:
    """xxh3-128 hex of ``text`` encoded as UTF-8 (see ``feed``).

    Short texts (history turns, queries, tag lines) are hashed again on every assemble;
    their hashes are remembered by the string itself, whose own hash Python keeps.
    """
    if len(text) <= _SHORT:
        return _short_hash(text)
    return slice_hash(text, 0, len(text))


def slice_hash(text: str, start: int, stop: int) -> str:
    """``text_hash(text[start:stop])`` without copying a long slice whole."""
    if stop - start <= _SHORT:
        return _short_hash(text[start:stop])
    hasher = xxhash.xxh3_128()
    feed(hasher, text, start, stop)
    return hasher.hexdigest()
