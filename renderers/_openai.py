"""OpenAI-style chat messages from an envelope: [system: L1+L2] -> L4 -> [user: L3+L5]."""

from __future__ import annotations

from typing import TypedDict

from pipeline import Envelope, TokenCounter

__all__ = ["ChatMessage", "chatml", "common_prefix_tokens", "openai_messages"]


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
    a, b = counter.encode(chatml(previous)), counter.encode(chatml(current))
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same
