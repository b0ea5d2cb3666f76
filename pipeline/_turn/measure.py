"""Exact tokens of a whole chat request built from an envelope's layers."""

from __future__ import annotations

from pipeline._model.envelope import BLOCK_SEP, LIBRARY_HEADING, Envelope, system_parts, user_parts
from pipeline._tokens.counter import TokenCounter

__all__ = ["MESSAGE_OVERHEAD", "REPLY_PRIMING", "request_tokens"]

# OpenAI chat framing: every message costs 3 tokens, and the reply is primed with 3.
MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3


def request_tokens(
    envelope: Envelope,
    counter: TokenCounter,
    *,
    per_message: int = MESSAGE_OVERHEAD,
    priming: int = REPLY_PRIMING,
    lead: str = "",
    trim: bool = False,
) -> int:
    """Exact tokens of the chat request (contents + per-message framing + reply priming).

    ``lead`` is the text a chat template writes right before each message's content in the
    same run ("\n\n" after a Llama header, "\n" after a ChatML role), counted in the
    framing; ``trim`` says the template strips each content (Llama 3's ``| trim``).
    """

    def content(text: str, tokens: int) -> int:
        if trim and text != text.strip():
            text = text.strip()
            tokens = counter.count(text)
        if lead and text[:1].isspace():  # lead and content may share a piece
            return counter.count(lead + text) - counter.count(lead)
        return tokens

    total = priming
    l2 = envelope.l2
    system = system_parts(envelope.l1, l2)
    edges = system[0][:1] + system[-1][-1:] if system else ""
    if (lead or trim) and any(c.isspace() for c in edges):
        text = BLOCK_SEP.join(system)  # rare: the template changes this message's edges
        total += content(text, counter.count(text)) + per_message
    elif l2.segments and l2.segments[0].text[:1] not in ("", "/", " ", "\n", "\t"):
        # Additive at the block boundary (see TokenCounter.count_joined): L2 is counted once.
        head = [s.text for s in envelope.l1.segments if s.text] + [LIBRARY_HEADING]
        total += counter.count(BLOCK_SEP.join(head) + BLOCK_SEP) + l2.tokens + per_message
    elif system:
        total += counter.count_joined(system) + per_message
    for segment in envelope.l4.segments:
        total += content(segment.text, segment.tokens) + per_message
    user = user_parts(envelope.l3, envelope.l5)
    total += content(BLOCK_SEP.join(user), counter.count_joined(user)) + per_message
    return total
