"""Exact tokens of a whole chat request built from an envelope's layers."""

from __future__ import annotations

from pipeline._errors import ConfigError
from pipeline._model.envelope import BLOCK_SEP, LIBRARY_HEADING, Envelope, system_parts, user_parts
from pipeline._tokens.counter import TokenCounter, count_joined_from
from pipeline._tokens.profiles import CHAT_TEMPLATES

__all__ = ["MESSAGE_OVERHEAD", "MISTRAL_REPLY_END", "REPLY_PRIMING", "request_tokens"]

# OpenAI chat framing: every message costs 3 tokens, and the reply is primed with 3.
MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3

MISTRAL_REPLY_END = 1
"""The ``</s>`` Mistral's instruct format writes after every assistant message."""


def request_tokens(
    envelope: Envelope,
    counter: TokenCounter,
    *,
    per_message: int = MESSAGE_OVERHEAD,
    priming: int = REPLY_PRIMING,
    lead: str = "",
    trim: bool = False,
    template: str = "messages",
) -> int:
    """Exact tokens of the chat request (contents + per-message framing + reply priming).

    ``lead`` is the text a chat template writes right before each message's content in the
    same run ("\n\n" after a Llama header, "\n" after a ChatML role), counted in the
    framing; ``trim`` says the template strips each content (Llama 3's ``| trim``).
    ``template`` is one of ``CHAT_TEMPLATES``; for "mistral", ``per_message`` is what frames
    each user turn and ``priming`` what opens the request (``<s>``).
    """
    if template not in CHAT_TEMPLATES:
        known = ", ".join(CHAT_TEMPLATES)
        raise ConfigError("template", f"must be one of {known}, got {template!r}")
    if template == "mistral":
        return _mistral_tokens(envelope, counter, per_message, priming)

    def content(text: str, tokens: int) -> int:
        if trim and text != text.strip():
            text = text.strip()
            tokens = counter.count(text)
        if lead and text[:1].isspace():  # lead and content may share a piece
            return counter.count(lead + text) - counter.count(lead)
        return tokens

    total = priming
    system = system_parts(envelope.l1, envelope.l2)
    edges = system[0][:1] + system[-1][-1:] if system else ""
    if (lead or trim) and any(c.isspace() for c in edges):
        text = BLOCK_SEP.join(system)  # rare: the template changes this message's edges
        total += content(text, counter.count(text)) + per_message
    elif system:
        total += _system_tokens(envelope, counter) + per_message
    for segment in envelope.l4.segments:
        total += content(segment.text, segment.tokens) + per_message
    user = user_parts(envelope.l3, envelope.l5)
    total += content(BLOCK_SEP.join(user), counter.count_joined(user)) + per_message
    return total


def _system_tokens(envelope: Envelope, counter: TokenCounter) -> int:
    """Tokens of the system text (L1 blocks, then the library heading and L2 entries)."""
    l2 = envelope.l2
    if l2.segments and l2.segments[0].text[:1] not in ("", "/", " ", "\n", "\t"):
        # Additive at the block boundary (see TokenCounter.count_joined): L2 is counted once.
        head = [s.text for s in envelope.l1.segments if s.text] + [LIBRARY_HEADING]
        return counter.count(BLOCK_SEP.join(head) + BLOCK_SEP) + l2.tokens
    return counter.count_joined(system_parts(envelope.l1, l2))


def _mistral_tokens(envelope: Envelope, counter: TokenCounter, per_user: int, start: int) -> int:
    """Exact tokens of the request as Mistral's instruct format (v2/v3) encodes it.

    ``<s>``, then per user turn ``[INST]`` + contents + ``[/INST]``, each reply (trailing
    spaces dropped) + ``</s>``;
    consecutive user messages are one turn (joined with a blank line), and the system text
    opens the last one: ``system + "\\n\\n" + user``. So the system text and library follow
    the history: they move every turn and a server's prefix cache holds only the history.
    """
    total = start
    pending: list[tuple[str, int]] = []  # the user messages of the turn being built
    for segment in envelope.l4.segments:
        if segment.role == "assistant":
            reply = segment.tokens
            if segment.text.endswith(" "):  # the format drops a reply's trailing spaces
                reply = counter.count(segment.text.rstrip(" "))
            total += per_user + _joined(pending, counter) + reply + MISTRAL_REPLY_END
            pending = []
        else:
            pending.append((segment.text, segment.tokens))
    user = user_parts(envelope.l3, envelope.l5)
    last = [*pending, (BLOCK_SEP.join(user), counter.count_joined(user))]
    system = system_parts(envelope.l1, envelope.l2)
    if not system:
        return total + per_user + _joined(last, counter)
    # The system text's count with its last block standing in for it: only that block's
    # tail and the next text's head decide how the blank line between them is counted.
    head = (system[-1], _system_tokens(envelope, counter))
    found = count_joined_from([head, *last], BLOCK_SEP, counter.count)
    if found is None:
        found = counter.count(BLOCK_SEP.join([*system, *(text for text, _ in last)]))
    return total + per_user + found


def _joined(parts: list[tuple[str, int]], counter: TokenCounter) -> int:
    """Tokens of the parts' texts joined with a blank line, from their counts when exact."""
    found = count_joined_from(parts, BLOCK_SEP, counter.count)
    return counter.count(BLOCK_SEP.join(t for t, _ in parts)) if found is None else found
