"""OpenAI-style chat messages from an envelope: [system: L1+L2] -> L4 -> [user: L3+L5]."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any, TypedDict

from lamina.pipeline import Envelope
from lamina.pipeline.layout import next_piece_start
from lamina.pipeline.tokens import TokenCounter

__all__ = [
    "ChatMessage",
    "chatml",
    "chatml_prefix_tokens",
    "common_prefix_length",
    "common_prefix_tokens",
    "openai_messages",
]


class ChatMessage(TypedDict):
    role: str
    content: str


def openai_messages(envelope: Envelope) -> list[ChatMessage]:
    """The message list of the request as sent (``Envelope.as_sent``); the system message
    is left out when L1 and L2 are both empty."""
    messages: list[ChatMessage] = []
    envelope = envelope.as_sent()
    if envelope.system_text:
        messages.append({"role": "system", "content": envelope.system_text})
    for role, text in envelope.history():
        messages.append({"role": role, "content": text})
    messages.append({"role": "user", "content": envelope.user_text})
    return messages


def chatml(messages: list[ChatMessage]) -> str:
    """One string for a message list, as the model reads it (for prefix comparisons)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


# Blocks of a message (L2 entries, context blocks) start with "<" after a blank line: after
# a newline the pre-tokenizer always starts a new piece there, so a request's tokens up to
# such a point are the sum of its blocks' tokens, each counted once and remembered.
_BLOCK_START = re.compile(r"\n\n(?=<)")
_MARGIN = 512


def _piece_boundary(text: str, at: int) -> int:
    """The first position from ``at`` where a line starts a new pre-tokenizer piece (the
    tokens of ``text[:p]`` are then the first tokens of ``text``), else the end."""
    return next_piece_start(text, at)


def common_prefix_tokens(
    previous: list[ChatMessage] | None, current: list[ChatMessage], counter: TokenCounter
) -> int:
    """How many leading tokens of ``current`` equal ``previous`` (the cacheable prefix).

    Exact without encoding both requests whole: the shared characters are found by
    comparing strings; up to the last block start well before the first difference the
    tokens are the shared blocks' counts (remembered across turns); after it only windows
    that end where a new piece starts are encoded, widened until they show the difference.
    """
    if not previous:
        return 0
    return chatml_prefix_tokens(chatml(previous), chatml(current), counter)


def chatml_prefix_tokens(a: str, b: str, counter: TokenCounter) -> int:
    """``common_prefix_tokens`` of two requests already serialized with ``chatml``."""
    same = common_prefix_length(a, b)
    starts = [0] + [m.end() for m in _BLOCK_START.finditer(b, 0, max(0, same - _MARGIN))]
    split = starts[-1]
    shared = sum(counter.count(b[i:j]) for i, j in itertools.pairwise(starts))
    reach = same + _MARGIN
    while True:
        end_a, end_b = _piece_boundary(a, reach), _piece_boundary(b, reach)
        left = counter.encode(a[split:end_a])
        right = counter.encode(b[split:end_b])
        n = common_prefix_length(left, right)
        if (
            n < min(len(left), len(right))  # a difference inside both windows
            or (n == len(left) and end_a == len(a))  # all of previous is shared
            or (n == len(right) and end_b == len(b))
        ):
            return shared + n
        reach = max(end_a, end_b) + (reach - split)


def common_prefix_length(a: Sequence[Any], b: Sequence[Any], block: int = 4096) -> int:
    """Length of the longest common prefix of two sequences (bytes, str, token lists).

    Compares slices (C speed) a block at a time, then narrows the first differing block by
    halving, instead of a Python loop over every element of a multi-megabyte request.
    """
    n = min(len(a), len(b))
    start = 0
    while start < n and a[start : start + block] == b[start : start + block]:
        start += block
    if start >= n:
        return n
    lo, hi = start, min(start + block, n)  # a[:lo] == b[:lo]; they differ before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo + 1 if a[lo] == b[lo] else lo
