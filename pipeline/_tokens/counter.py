"""Exact, offline token counts: OpenAI's encodings ship inside this package; open models'
(Llama, Qwen, Mistral) load from optional extras (``lamina.pipeline._tokens.open_encodings``)."""

from __future__ import annotations

import functools
import itertools
import os
import re
import string
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import attrs
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._hashing import slice_hash
from lamina.pipeline._tokens.open_encodings import OPEN_TOKENIZERS, load_open_encoding

__all__ = [
    "TOKENIZERS",
    "CountMemo",
    "TokenCounter",
    "count_joined_from",
    "count_with_sep_from",
    "encoded_length",
    "get_encoding",
    "next_piece_start",
    "shared_counts",
    "starts_piece",
]

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"

# pat_str and special tokens as in tiktoken_ext/openai_public.py (tiktoken 0.14).
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""  # noqa: E501


@attrs.frozen
class _Spec:
    pat_str: str
    sha256: str
    special_tokens: dict[str, int]


_SPECS: dict[str, _Spec] = {
    "o200k_base": _Spec(
        _O200K_PAT,
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    ),
    "cl100k_base": _Spec(
        _CL100K_PAT,
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        {
            _ENDOFTEXT: 100257,
            _FIM_PREFIX: 100258,
            _FIM_MIDDLE: 100259,
            _FIM_SUFFIX: 100260,
            _ENDOFPROMPT: 100276,
        },
    ),
}

BUILTIN_TOKENIZERS: tuple[str, ...] = tuple(sorted(_SPECS))
TOKENIZERS: tuple[str, ...] = BUILTIN_TOKENIZERS + OPEN_TOKENIZERS
"""Every tokenizer name: the built-in ones, then open models' (each needs an extra)."""

_PUNCT = frozenset(string.punctuation)
_lock = threading.Lock()
_encodings: dict[str, tiktoken.Encoding] = {}


def _unknown(name: str) -> ConfigError:
    return ConfigError(
        "tokenizer",
        f"unknown tokenizer {name!r} (known: {', '.join(BUILTIN_TOKENIZERS)}; "
        f"with an extra: {', '.join(OPEN_TOKENIZERS)})",
    )


def get_encoding(name: str) -> tiktoken.Encoding:
    """The named encoding, built once per process from package data (no network); an open
    model's comes from its extra's package, or ``TokenizerUnavailable`` names the extra."""
    enc = _encodings.get(name)  # built already: no lock (entries are never replaced)
    if enc is not None:
        return enc
    if name not in TOKENIZERS:
        raise _unknown(name)
    with _lock:
        enc = _encodings.get(name)
        if enc is None and name in OPEN_TOKENIZERS:
            enc = _encodings[name] = load_open_encoding(name)
        if enc is None:
            spec = _SPECS[name]
            path = resources.files("lamina.pipeline._tokens") / "encodings" / f"{name}.tiktoken"
            with resources.as_file(path) as real:
                ranks = load_tiktoken_bpe(str(real), expected_hash=spec.sha256)
            enc = tiktoken.Encoding(
                name=name,
                pat_str=spec.pat_str,
                mergeable_ranks=ranks,
                special_tokens=dict(spec.special_tokens),
            )
            _encodings[name] = enc
        return enc


MAX_REMEMBERED = 1 << 16
"""Counts a ``CountMemo`` keeps (by text hash) before it forgets the oldest quarter."""

PARALLEL_CHARS = 1 << 20
"""New text (characters) in one ``count_many`` call from which it encodes on threads."""

_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


@functools.cache
def _workers() -> int:
    return min(4, os.cpu_count() or 1)


def _pool(workers: int) -> ThreadPoolExecutor:
    """One shared pool per size, made on first use (threads exit with the process)."""
    with _pool_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="lamina-count")
        return pool


def _in_child() -> None:
    """A forked child has none of the parent's threads: a pool it inherited would queue its
    work for workers that do not exist, so it makes its own."""
    global _pool_lock
    _pool_lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_in_child)


def count_with_sep_from(
    text: str, tokens: int, sep: str, count: Callable[[str], int]
) -> int | None:
    """Exact count of ``text + sep`` (``sep`` newlines only) from ``text``'s count ``tokens``,
    counting at most a short tail with ``count``; None when only encoding it all would tell.

    Only the last pre-tokenizer piece of ``text`` can change when newlines follow: an ASCII
    letter or digit piece does not absorb them (add ``sep``'s own count); a run of ASCII
    punctuation after a letter, a digit, one space or a newline does (re-count just that run).
    """
    if not text or not sep or sep.strip("\n"):
        return None
    last = text[-1]
    if last.isascii() and last.isalnum():
        return tokens + count(sep)
    if last not in _PUNCT:
        return None
    start = len(text)
    while start > 0 and text[start - 1] in _PUNCT:
        start -= 1
    if start == 0:
        return None
    before = text[start - 1]
    if before == " ":
        start -= 1
    elif before == "\n":
        if text[start] == "/":  # o200k: a punctuation piece before the newline takes it
            return None
    elif not (before.isascii() and before.isalnum()):
        return None
    tail = text[start:]
    return tokens - count(tail) + count(tail + sep)


def count_joined_from(
    parts: Sequence[tuple[str, int]], sep: str, count: Callable[[str], int]
) -> int | None:
    """Exact count of ``sep.join`` of (text, count) parts from their counts, counting at
    most short tails with ``count``; None when the pieces may not add up."""
    total = 0
    for i, (part, n) in enumerate(parts):
        if i == len(parts) - 1:
            return total + n
        if not starts_piece(parts[i + 1][0]):
            return None
        with_sep = count_with_sep_from(part, n, sep, count)
        if with_sep is None:
            return None
        total += with_sep
    return total


# The one piece rule: after a newline, a character other than whitespace (``str.isspace``,
# which ``\s`` matches exactly) or a slash starts a new pre-tokenizer piece, in every
# encoding the counter knows (tests/pipeline/test_piece_rule.py checks them all).
_PIECE_HEAD = r"[^\s/]"
_PIECE_START = re.compile(_PIECE_HEAD)
_LINE_PIECE = re.compile(rf"\n(?={_PIECE_HEAD})")


def starts_piece(text: str) -> bool:
    """Whether, after a newline, ``text`` starts a new pre-tokenizer piece (every encoding
    alike): it does unless it is empty or starts with whitespace or a slash."""
    return _PIECE_START.match(text) is not None


def next_piece_start(text: str, at: int = 0) -> int:
    """The first position from ``at`` that follows a newline and starts a new piece
    (``starts_piece``): the tokens of ``text[:p]`` are the first tokens of ``text``; else
    the end of ``text``."""
    m = _LINE_PIECE.search(text, at)
    return m.end() if m else len(text)


ENCODE_CHUNK = 1 << 13
"""Characters encoded at once when counting: the encoder returns a list of token ids (about
nine bytes of Python objects per character of text), so a long text is counted in chunks
that end where a new piece starts (the one piece rule), never as one list."""


def encoded_length(enc: tiktoken.Encoding, text: str, start: int, stop: int) -> int:
    """The number of tokens of ``text[start:stop]``, encoded ``ENCODE_CHUNK`` at a time."""
    n = 0
    while start < stop:
        end = stop
        if stop - start > 2 * ENCODE_CHUNK:
            m = _LINE_PIECE.search(text, start + ENCODE_CHUNK, stop)
            end = m.end() if m else stop
        whole = start == 0 and end == len(text)
        n += len(enc.encode_ordinary(text if whole else text[start:end]))
        start = end
    return n


_SPLIT_FROM = 4096
_HEAD_LINE_MAX = 2048


def _split_head(text: str) -> int:
    """Where a long text is counted apart: after its first line, when that is exact (after
    a newline the pre-tokenizer starts a new piece unless whitespace or (o200k) a slash
    follows: the rule ``count_joined`` relies on); else 0 (counted whole)."""
    if len(text) < _SPLIT_FROM:
        return 0
    end = text.find("\n", 0, _HEAD_LINE_MAX) + 1
    if end == 0 or not starts_piece(text[end : end + 1]):
        return 0
    return end


def _parts(text: str) -> list[tuple[int, int]]:
    """The (start, stop) slices ``text`` is counted as (see ``_split_head``)."""
    end = _split_head(text)
    return [(0, end), (end, len(text))] if end else [(0, len(text))]


class CountMemo:
    """Exact token counts by text hash for one encoding, bounded: past ``MAX_REMEMBERED``
    entries it forgets its oldest quarter. Thread-safe where it forgets."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._counts)

    def get(self, digest: str) -> int | None:
        return self._counts.get(digest)

    def put(self, digest: str, n: int) -> None:
        with self._lock:
            if len(self._counts) >= MAX_REMEMBERED:
                for old in list(itertools.islice(self._counts, MAX_REMEMBERED // 4)):
                    self._counts.pop(old, None)
            self._counts[digest] = n

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


_shared_lock = threading.Lock()
_shared: dict[str, CountMemo] = {}


def shared_counts(name: str) -> CountMemo:
    """The process's count memo for encoding ``name``: a stateless server restoring a
    conversation per request counts its history and library once, not per request."""
    with _shared_lock:
        memo = _shared.get(name)
        if memo is None:
            memo = _shared[name] = CountMemo()
        return memo


@attrs.define
class TokenCounter:
    """Counts tokens exactly; remembers counts by the text's hash so nothing is counted twice.

    ``encoded_chars`` counts the characters actually sent to the encoder, so tests and
    benchmarks can show that a warm turn only encodes what is new.
    """

    name: str = "o200k_base"
    memo: CountMemo | None = attrs.field(default=None, repr=False, eq=False)
    """Where counts are remembered: by default the process's memo for this encoding, shared
    by every counter (a count is a fact about the text); a ``CountMemo()`` of its own keeps
    a counter's meters independent of others."""
    encoded_chars: int = 0
    hits: int = 0

    def __attrs_post_init__(self) -> None:
        if self.name not in TOKENIZERS:
            raise _unknown(self.name)
        if self.memo is None:
            self.memo = shared_counts(self.name)
        if self.name in OPEN_TOKENIZERS:
            get_encoding(self.name)  # a missing extra fails here, not mid-turn

    @property
    def encoding(self) -> tiktoken.Encoding:
        return get_encoding(self.name)

    def count(self, text: str) -> int:
        """Exact token count of ``text`` (special-token strings count as plain text).

        A long text is counted as its first line and the rest (see ``_split_head``), so a
        block rendered again with other attributes re-encodes only its tag line.
        """
        if len(text) < _SPLIT_FROM:  # the usual case: one slice
            return self._count_slice(text, 0, len(text))
        return sum(self._count_slice(text, start, stop) for start, stop in _parts(text))

    def _count_slice(self, text: str, start: int, stop: int) -> int:
        if start == stop:
            return 0
        digest = slice_hash(text, start, stop)
        cached = self._memo.get(digest)
        if cached is not None:
            self.hits += 1
            return cached
        n = self.count_once(text[start:stop] if start or stop < len(text) else text)
        self._memo.put(digest, n)
        return n

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Exact counts of ``texts``, as ``count`` gives them.

        Each slice is hashed once and encoded only if not counted yet; when those add up to
        ``PARALLEL_CHARS`` or more (a cold build) they are encoded on a few threads:
        tiktoken releases the GIL while it encodes.
        """
        # Slices, not copies: a cold build's blocks are not held twice while counting.
        split = [_parts(t) for t in texts]
        slices = [(t, a, b) for t, parts in zip(texts, split, strict=True) for a, b in parts]
        digests = [slice_hash(t, a, b) if a < b else "" for t, a, b in slices]
        # Read the known counts first (one read each): remembering the new ones, here or
        # on another thread, may forget old ones.
        counts: dict[str, int] = {"": 0}
        missing: dict[str, tuple[str, int, int]] = {}
        for d, part in zip(digests, slices, strict=True):
            if d and d not in counts and d not in missing:
                known = self._memo.get(d)
                if known is None:
                    missing[d] = part
                else:
                    counts[d] = known
        size = sum(b - a for _, a, b in missing.values())
        workers = _workers()
        enc = self.encoding

        def encode(part: tuple[str, int, int]) -> int:
            return encoded_length(enc, *part)

        parallel = size >= PARALLEL_CHARS and len(missing) >= 2 and workers >= 2
        made = (
            _pool(workers).map(encode, missing.values())
            if parallel
            else map(encode, missing.values())
        )
        for digest, n in zip(missing, made, strict=True):
            counts[digest] = n
            self._memo.put(digest, n)
        self.encoded_chars += size
        self.hits += sum(1 for d in digests if d) - len(missing)
        found = iter(counts[d] for d in digests)
        return [sum(itertools.islice(found, len(parts))) for parts in split]

    def known(self, text: str) -> int | None:
        """The count of ``text`` if the memo holds it (nothing is encoded), else None."""
        total = 0
        for start, stop in _parts(text):
            n = self._memo.get(slice_hash(text, start, stop)) if start < stop else 0
            if n is None:
                return None
            total += n
        return total

    def count_cut(self, text: str, cuts: Sequence[int]) -> int:
        """Exact count of ``text`` as the sum of its parts' counts between ``cuts``, each
        part remembered, so another text holding the same parts (a preview's sections)
        finds their counts. Only a cut that follows a newline and starts a new piece counts
        (the one piece rule); the others are ignored."""
        at = sorted({c for c in cuts if 0 < c < len(text) and text[c - 1] == "\n"})
        at = [c for c in at if starts_piece(text[c : c + 1])]
        bounds = zip([0, *at], [*at, len(text)], strict=True)
        return sum(self.count_many([text[a:b] for a, b in bounds]))

    def learn(self, text: str, tokens: int) -> None:
        """Take ``tokens`` as the count of ``text`` without encoding it (but its first line).

        For counts made exactly from the counts of the parts a text was built from (a
        preview from its sections); a wrong number here makes every budget wrong.
        """
        end = _split_head(text)
        if end:
            tokens -= self._count_slice(text, 0, end)
        digest = slice_hash(text, end, len(text))
        if end < len(text) and self._memo.get(digest) is None:
            self._memo.put(digest, tokens)

    @property
    def _memo(self) -> CountMemo:
        memo = self.memo
        assert memo is not None  # set in __attrs_post_init__
        return memo

    def count_once(self, text: str) -> int:
        """Exact count of a text not worth remembering (a sentence being ranked, say)."""
        if not text:
            return 0
        self.encoded_chars += len(text)
        return encoded_length(self.encoding, text, 0, len(text))

    def count_joined(self, parts: Sequence[str], sep: str = "\n\n") -> int:
        """Exact count of ``sep.join(parts)``, reusing each part's cached count.

        After a newline, tiktoken's pre-tokenizer always starts a new piece unless the next
        character is whitespace or (o200k) a slash, so the count is additive over
        ``part + sep`` pieces; otherwise the joined text is counted whole.
        """
        parts = [p for p in parts if p]
        if not parts:
            return 0
        if not sep.endswith("\n") or not all(starts_piece(p) for p in parts[1:]):
            return self.count(sep.join(parts))
        return sum(self.count_with_sep(p, sep) for p in parts[:-1]) + self.count(parts[-1])

    def count_with_sep(self, text: str, sep: str = "\n\n") -> int:
        """Exact count of ``text + sep`` for a newline ``sep``, without encoding ``text`` again
        (see ``count_with_sep_from``)."""
        if not text:
            return self.count(sep)
        found = count_with_sep_from(text, self.count(text), sep, self.count)
        return self.count(text + sep) if found is None else found

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (uncached; for cuts and prefix comparisons), counted in
        ``encoded_chars`` like every other encode."""
        self.encoded_chars += len(text)
        return self.encoding.encode_ordinary(text)
