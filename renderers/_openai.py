"""OpenAI-style chat messages from an envelope: [system: L1+L2] -> L4 -> [user: L3+L5]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from pipeline import Envelope, TokenCounter

__all__ = [
    "ChatMessage",
    "chatml",
    "common_prefix_length",
    "common_prefix_tokens",
    "openai_messages",
]


class ChatMessage(TypedDict):
    role: str
    content: str


def openai_messages(envelope: Envelope) -> list[ChatMessage]:
    """The message list; the system message is left out when L1 and L2 are both empty."""
    messages: list[ChatMessage] = []
    if envelope.system_text:
        messages.append({"role": "system", "content": envelope.system_text})
    for role, text in envelope.history():
        messages.append({"role": role, "content": text})
    messages.append({"role": "user", "content": envelope.user_text})
    return messages


def chatml(messages: list[ChatMessage]) -> str:
    """One string for a message list, as the model reads it (for prefix comparisons)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def common_prefix_tokens(
    previous: list[ChatMessage] | None, current: list[ChatMessage], counter: TokenCounter
) -> int:
    """How many leading tokens of ``current`` equal ``previous`` (the cacheable prefix)."""
    if not previous:
        return 0
    return common_prefix_length(counter.encode(chatml(previous)), counter.encode(chatml(current)))


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
