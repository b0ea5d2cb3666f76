"""Exact tokens of a whole chat request built from an envelope's layers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._model.envelope import (
    BLOCK_SEP,
    LIBRARY_HEADING,
    Envelope,
    LayerName,
    system_parts,
    user_blocks,
)
from lamina.pipeline._tokens.counter import (
    TokenCounter,
    count_joined_from,
    count_with_sep_from,
    starts_piece,
)
from lamina.pipeline._tokens.profiles import CHAT_TEMPLATES, OPENAI_FRAMING, Framing
from lamina.pipeline._turn.draft import Draft, DraftLayer

__all__ = [
    "MESSAGE_OVERHEAD",
    "MISTRAL_REPLY_END",
    "REPLY_PRIMING",
    "joined_tokens",
    "request_tokens",
    "sent_tokens",
    "user_tokens",
]

MESSAGE_OVERHEAD = OPENAI_FRAMING.per_message
REPLY_PRIMING = OPENAI_FRAMING.priming

MISTRAL_REPLY_END = 1
"""The ``</s>`` Mistral's instruct format writes after every assistant message."""


def joined_tokens(parts: Sequence[tuple[str, int, int | None]], counter: TokenCounter) -> int:
    """Exact count of ``BLOCK_SEP.join`` of the parts' texts from each part's count and,
    where known, the count of the part followed by ``BLOCK_SEP`` (else a short tail is
    counted); ``count_joined`` when the pieces may not add up."""
    total = 0
    for i, (text, tokens, with_sep) in enumerate(parts):
        if i and not starts_piece(text):
            break
        if i == len(parts) - 1:
            return total + tokens
        if with_sep is None:
            with_sep = count_with_sep_from(text, tokens, BLOCK_SEP, counter.count)
            if with_sep is None:
                break
        total += with_sep
    else:
        return 0
    return counter.count_joined([text for text, _, _ in parts])


def _each_with_sep(parts: Sequence[tuple[str, int]], counter: TokenCounter) -> int | None:
    """Exact count of ``BLOCK_SEP.join(texts) + BLOCK_SEP`` from the parts' counts (each
    block but the first starts a new piece: ``count_joined``'s rule); None if unsure."""
    total = 0
    for i, (text, tokens) in enumerate(parts):
        if i and not starts_piece(text):
            return None
        with_sep = count_with_sep_from(text, tokens, BLOCK_SEP, counter.count)
        if with_sep is None:
            return None
        total += with_sep
    return total


def request_tokens(
    envelope: Envelope | Draft,
    counter: TokenCounter,
    framing: Framing = OPENAI_FRAMING,
) -> int:
    """Exact tokens of the chat request (contents + per-message framing + reply priming).

    ``framing.lead`` is the text a chat template writes right before each message's
    content in the same run ("\n\n" after a Llama header, "\n" after a ChatML role),
    counted in the framing; ``framing.trim`` says the template strips each content (Llama
    3's ``| trim``). ``framing.template`` is one of ``CHAT_TEMPLATES``; for "mistral",
    ``per_message`` is what frames each user turn and ``priming`` what opens the request
    (``<s>``). A request with no system text gets the template's ``default_system``
    message when it has one (Qwen2.5's default prompt, Llama 3.1's date header). Blocks
    are counted from their segments' known counts (short tails only), so measuring a
    draft after a cut encodes nothing but what the cut changed. An envelope whose library
    growth is deferred is counted as it is sent (``Envelope.as_sent``).
    """
    measured = _sent(envelope) if isinstance(envelope, Envelope) else envelope
    return _request_tokens(measured, counter, framing)


@attrs.frozen
class _Sent:
    """The request a batched envelope is sent as, layer by layer, for counting: its
    segments and counts (``Envelope.as_sent`` without joining or hashing anything)."""

    l1: DraftLayer
    l2: DraftLayer
    l3: DraftLayer
    l4: DraftLayer
    l5: DraftLayer
    # Each L3 segment's tokens followed by a blank line, by key (``Draft.with_sep``), where
    # known: the user message is then counted from its blocks' counts alone.
    seps: Mapping[str, int | None] = attrs.field(factory=dict)


def _sent(envelope: Envelope) -> Envelope | _Sent:
    b = envelope.batch
    if b is None or b.as_built(len(envelope.l2.segments)):
        return envelope
    deferred = {s.key: s for s in b.turns}
    history = tuple(deferred.get(s.key, s) for s in envelope.l4.segments)
    return _Sent(
        DraftLayer(LayerName.L1, envelope.l1.segments, envelope.l1.tokens),
        DraftLayer(LayerName.L2, envelope.l2.segments[: b.settled], b.library_tokens),
        DraftLayer(LayerName.L3, (), 0),
        DraftLayer(LayerName.L4, history, sum(s.tokens for s in history)),
        DraftLayer(LayerName.L5, (b.user,), b.user.tokens),
    )


def sent_tokens(
    draft: Draft,
    settled: int,
    library_tokens: int,
    messages: Mapping[str, int],
    counter: TokenCounter,
    framing: Framing = OPENAI_FRAMING,
) -> int:
    """Exact tokens of ``draft`` sent as an extension of a batch (``Envelope.as_sent``):
    its system message holds the first ``settled`` library entries (``library_tokens``
    joined), and history's user messages the batch sent (``messages``: key -> exact
    tokens) stand where the draft has their queries."""
    history = tuple(
        attrs.evolve(s, tokens=messages[s.key]) if s.key in messages else s
        for s in draft.l4.segments
    )
    sent = _Sent(
        draft.l1,
        DraftLayer(LayerName.L2, draft.l2.segments[:settled], library_tokens),
        draft.l3,
        DraftLayer(LayerName.L4, history, sum(s.tokens for s in history)),
        draft.l5,
        draft.with_sep(),
    )
    return _request_tokens(sent, counter, framing)


def _request_tokens(
    envelope: Envelope | Draft | _Sent, counter: TokenCounter, framing: Framing
) -> int:
    lead, trim, per_message, priming = (
        framing.lead,
        framing.trim,
        framing.per_message,
        framing.priming,
    )
    if framing.template not in CHAT_TEMPLATES:
        known = ", ".join(CHAT_TEMPLATES)
        raise ConfigError("template", f"must be one of {known}, got {framing.template!r}")
    if framing.template == "mistral":
        return _mistral_tokens(envelope, counter, per_message, priming)

    def content(text: str, tokens: int) -> int:
        if trim and text != text.strip():
            text = text.strip()
            tokens = counter.count(text)
        if lead and text[:1].isspace():  # lead and content may share a piece
            return counter.count(lead + text) - counter.count(lead)
        return tokens

    total = priming
    # Only a template that leads or trims reads the system text's edges (L2 may be long).
    system = system_parts(envelope.l1, envelope.l2) if lead or trim else []
    edges = system[0][:1] + system[-1][-1:] if system else ""
    if any(c.isspace() for c in edges):
        text = BLOCK_SEP.join(system)  # rare: the template changes this message's edges
        total += content(text, counter.count(text)) + per_message
    elif envelope.l2.segments or any(s.text for s in envelope.l1.segments):
        total += _system_tokens(envelope, counter) + per_message
    elif framing.default_system is not None:  # the template writes its own system message
        default = framing.default_system
        total += content(default, counter.count(default)) + per_message
    for segment in envelope.l4.segments:
        total += content(segment.text, segment.tokens) + per_message
    blocks = _user_known(envelope, counter)
    edge = (blocks[0][0][:1] + blocks[-1][0][-1:]) if blocks else ""
    if (lead or trim) and any(c.isspace() for c in edge):
        text = BLOCK_SEP.join(t for t, _, _ in blocks)
        total += content(text, counter.count_joined([t for t, _, _ in blocks])) + per_message
    else:
        total += joined_tokens(blocks, counter) + per_message
    return total


def user_tokens(envelope: Envelope, counter: TokenCounter) -> int:
    """The user message's exact tokens (no framing), from its blocks' known counts."""
    return joined_tokens(_user_known(envelope, counter), counter)


def _user_known(
    envelope: Envelope | Draft | _Sent, counter: TokenCounter
) -> list[tuple[str, int, int | None]]:
    """The user message's blocks with their tokens and, for a draft's L3 blocks, their
    tokens followed by a blank line (see ``joined_tokens``)."""
    seps: Mapping[str, int | None] = {}
    if isinstance(envelope, Draft):
        seps = envelope.with_sep()
    elif isinstance(envelope, _Sent):
        seps = envelope.seps
    return [
        (text, counter.count(text), None) if seg is None else (text, seg.tokens, seps.get(seg.key))
        for text, seg in user_blocks(envelope.l3, envelope.l5)
    ]


def _system_tokens(envelope: Envelope | Draft | _Sent, counter: TokenCounter) -> int:
    """Tokens of the system text (L1 blocks, then the library heading and L2 entries)."""
    l2 = envelope.l2
    first = next((s.text for s in l2.segments if s.text), "")  # an entry kept unsent: none
    if first[:1] not in ("", "/", " ", "\n", "\t"):
        # Additive at the block boundary (see TokenCounter.count_joined): L2 is counted once.
        head = [(s.text, s.tokens) for s in envelope.l1.segments if s.text]
        head.append((LIBRARY_HEADING, counter.count(LIBRARY_HEADING)))
        tokens = _each_with_sep(head, counter)
        if tokens is None:
            tokens = counter.count(BLOCK_SEP.join(t for t, _ in head) + BLOCK_SEP)
        return tokens + l2.tokens
    return counter.count_joined(system_parts(envelope.l1, l2))


def _mistral_tokens(
    envelope: Envelope | Draft | _Sent, counter: TokenCounter, per_user: int, start: int
) -> int:
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
    user = _user_known(envelope, counter)
    last = [*pending, (BLOCK_SEP.join(t for t, _, _ in user), joined_tokens(user, counter))]
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
