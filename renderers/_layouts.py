"""Provider-neutral prompts in four layouts: default (library in system), batched (the
library's growth deferred to the next break), append-only, naive.

Every provider request renderer and the cache simulator start from a ``Prompt``, so the
bytes that are sent and the bytes that are costed are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

from lamina.pipeline import Envelope, Form, Segment
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.layout import (
    APPEND_REFERENCES_INTRO,
    RECALL_SOURCE,
    append_parts,
    arrange_user,
    join_blocks,
    segment_reference,
    system_parts,
)
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.tools import TOOL_SOURCE, chunk_source
from lamina.renderers._xml import render_xml

__all__ = [
    "APPEND_REFERENCES_INTRO",
    "LAYOUTS",
    "Block",
    "Layout",
    "Message",
    "Prompt",
    "append_only_prompt",
    "batched_prompt",
    "build_prompt",
    "default_prompt",
    "naive_prompt",
]

Layout = Literal["default", "batched", "append-only", "naive"]
LAYOUTS: tuple[Layout, ...] = ("default", "batched", "append-only", "naive")


# Anchors name the positions a cache breakpoint may go, so renderers and the simulator
# agree on where they are whatever the layout.
L1_STABLE = "l1-stable"
SYSTEM_END = "system-end"
HISTORY_END = "history-end"
TURN_END = "turn-end"


@attrs.frozen
class Block:
    """One text block; ``anchor`` marks a position a cache breakpoint may use."""

    text: str
    anchor: str = ""


@attrs.frozen
class Message:
    role: Literal["user", "assistant"]
    blocks: tuple[Block, ...]

    @property
    def text(self) -> str:
        return join_blocks(b.text for b in self.blocks)


@attrs.frozen
class Prompt:
    """System blocks and the message list of one request, in one layout."""

    layout: Layout
    turn: int
    system: tuple[Block, ...]
    messages: tuple[Message, ...]

    @property
    def system_text(self) -> str:
        return join_blocks(b.text for b in self.system)

    def chat(self) -> list[tuple[str, str]]:
        """(role, content) pairs with the system message first (omitted when empty)."""
        head = [("system", self.system_text)] if self.system_text else []
        return head + [(m.role, m.text) for m in self.messages]


def _system_blocks(texts: Sequence[tuple[str, str]]) -> tuple[Block, ...]:
    kept = [(key, text) for key, text in texts if text]
    blocks: list[Block] = []
    for i, (key, text) in enumerate(kept):
        if i == len(kept) - 1:
            anchor = SYSTEM_END
        elif key == "system:stable":
            anchor = L1_STABLE
        else:
            anchor = ""
        blocks.append(Block(text, anchor))
    return tuple(blocks)


def _l1(envelope: Envelope) -> list[tuple[str, str]]:
    return [(s.key, s.text) for s in envelope.l1.segments]


def _history(pairs: Sequence[tuple[str, str]]) -> list[Message]:
    out = [Message("assistant" if r == "assistant" else "user", (Block(t),)) for r, t in pairs]
    if out:
        last = out[-1]
        out[-1] = Message(last.role, (attrs.evolve(last.blocks[-1], anchor=HISTORY_END),))
    return out


def default_prompt(envelope: Envelope) -> Prompt:
    """``[system: L1 + L2] -> [L4 history] -> [user: L3 + L5]``: the envelope as it is sent.
    When its library growth is deferred (``Envelope.batch``), the system message holds the
    settled library and each deferred turn's user message carries its context
    (``Envelope.as_sent``), so the request extends the one before it byte for byte."""
    sent = envelope.as_sent()
    l1 = _l1(sent)
    parts = system_parts(sent.l1, sent.l2)
    keyed = l1 + [("", p) for p in parts[len(l1) :]]
    # A batched request is extended by the next one unless that one settles: the end of
    # this turn is marked for the cache. (Marking only turns that extended, or only those
    # well under the limit, cost more on chat30 at 6,000 and the public vault at 8k than
    # it saved at 4k: measured with Anthropic's write premium.)
    anchor = "" if envelope.batch is None else TURN_END
    user = Message("user", (Block(sent.user_text, anchor),))
    return Prompt(
        "default", envelope.turn, _system_blocks(keyed), (*_history(sent.history()), user)
    )


def _reference_text(segment: Segment) -> str:
    return render_xml(segment_reference(segment))


def _turn_scoped(envelope: Envelope) -> tuple[list[Segment], list[Segment]]:
    """This turn's tool results and retrieval chunks (which live for one turn only), and
    the other L3 segments, each in L3 order."""
    segments = envelope.l3.segments
    tools = [s for s in segments if s.source_type == TOOL_SOURCE]
    chunks = [s for s in segments if s.source_type != TOOL_SOURCE and _scoped(s)]
    rest = [s for s in segments if s.source_type != TOOL_SOURCE and not _scoped(s)]
    return tools + chunks, rest


def _scoped(segment: Segment) -> bool:
    """A retrieval chunk or a recalled block: this turn's only, never recorded as sent."""
    return segment.source_type == RECALL_SOURCE or chunk_source(segment.key) is not None


def _append_user_text(envelope: Envelope, sent: dict[str, str], *, later: bool = False) -> str:
    """This turn's user message when context stays where it was first sent
    (``lamina.pipeline.layout.append_parts``, which the conversation's batch shares):
    nothing is settled in a library, references are rendered as XML. ``later``: as a later
    request carries it, without its recalled blocks (they belong to their turn only)."""
    parts = append_parts(envelope, sent, lambda _key: None, _reference_text)
    return join_blocks(
        text
        for text, seg in parts
        if not (later and seg is not None and seg.source_type == RECALL_SOURCE)
    )


def _replies(envelope: Envelope) -> dict[int, str]:
    out: dict[int, str] = {}
    for seg in envelope.l4.segments:
        if seg.role == "assistant":
            out[int(seg.key.split(":")[1])] = seg.text
    return out


def append_only_prompt(envelopes: Sequence[Envelope]) -> Prompt:
    """Context stays in the user message of the turn that attached it; later turns refer
    back, so each request extends the previous one byte for byte (``envelopes`` is the
    conversation so far, the current turn last)."""
    if not envelopes:
        raise ConfigError("layout", "append-only needs at least one envelope")
    current = envelopes[-1]
    replies = _replies(current)
    sent: dict[str, str] = {}
    messages: list[Message] = []
    for env in envelopes:
        text = _append_user_text(env, sent, later=env is not current)
        if env is current:
            if messages:
                last = messages[-1]
                messages[-1] = Message(last.role, (Block(last.blocks[0].text, HISTORY_END),))
            messages.append(Message("user", (Block(text, TURN_END),)))
            break
        messages.append(Message("user", (Block(text),)))
        if env.turn in replies:
            messages.append(Message("assistant", (Block(replies[env.turn]),)))
    return Prompt("append-only", current.turn, _system_blocks(_l1(current)), tuple(messages))


def naive_prompt(envelopes: Sequence[Envelope]) -> Prompt:
    """The baseline: L1 as system, bare history, and every attachment so far in full in
    the user message, each turn; this turn's tool results and retrieval chunks come first
    and are not carried into later turns."""
    if not envelopes:
        raise ConfigError("layout", "naive needs at least one envelope")
    current = envelopes[-1]
    latest: dict[str, str] = {}
    for env in envelopes:
        for seg in _turn_scoped(env)[1]:
            if seg.form is not Form.REFERENCE:
                latest[seg.key] = seg.text
            elif seg.key not in latest:
                entry = env.l2.get(seg.key)
                latest[seg.key] = entry.text if entry is not None else seg.text
    context = [*(s.text for s in _turn_scoped(current)[0]), *latest.values()]
    parts = arrange_user([], [], [], [(text, None) for text in context], (current.query, None))
    user = Message("user", (Block(join_blocks(text for text, _ in parts)),))
    return Prompt(
        "naive",
        current.turn,
        _system_blocks(_l1(current)),
        (*_history(current.history()), user),
    )


# --- batched: the library's growth waits for the next break ----------------------------

BATCH_MARGIN = 0.02
"""Share of the budget's limit a batched request keeps free below it, for the counts it
estimates from segments (joins between blocks, framing) before the exact count."""


def _l2_extends(base: Envelope, env: Envelope) -> bool:
    before, after = base.l2.segments, env.l2.segments
    return len(after) >= len(before) and all(
        a.key == b.key and a.text == b.text for a, b in zip(before, after, strict=False)
    )


def _history_extends(base: Envelope, turns: Sequence[Envelope], env: Envelope) -> bool:
    """``env``'s history is ``base``'s plus each deferred turn's query and reply, whole."""
    old, new = base.history(), env.history()
    if new[: len(old)] != old:
        return False
    rest = new[len(old) :]
    queries = [role_text for role_text in rest if role_text[0] == "user"]
    return [text for _, text in queries] == [t.query for t in turns] and all(
        role in ("user", "assistant") for role, _ in rest
    )


@attrs.frozen
class _Batch:
    """The batched request being extended: where it settled, its messages, what it sent
    in full (key to content hash) and its exact tokens (contents + 3 a message)."""

    start: int
    system: tuple[Block, ...]
    messages: tuple[Message, ...]
    sent: tuple[tuple[str, str], ...]
    tokens: int


def _settle(index: int, env: Envelope, counter: TokenCounter) -> _Batch:
    prompt = default_prompt(env)
    sent = {s.key: s.content_hash for s in env.l2.segments if s.form is not Form.REFERENCE}
    _append_user_text(env, sent)  # records what this request sent in full
    tokens = sum(counter.count(text) + _PER_MESSAGE for _, text in prompt.chat())
    messages = tuple(Message(m.role, (Block(m.text),)) for m in prompt.messages)
    return _Batch(index, prompt.system, messages, tuple(sent.items()), tokens)


_PER_MESSAGE = 3  # OpenAI's framing, the budget's default; the margin covers others


def batched_prompt(envelopes: Sequence[Envelope], counter: TokenCounter | None = None) -> Prompt:
    """The library layout with its growth deferred. A request is settled (the envelope as
    built) on the first turn and on any turn whose system message or history breaks the
    prefix anyway (L1 changed; an L2 entry compacted, evicted, refreshed or reordered;
    history cut or shortened) or that would not fit; in between, each turn's context stays
    in the user message that sent it (as in append-only: what was sent in full, or sits in
    the settled library, is referred to), so every request extends the one before it.
    "Would not fit": its exact count (``counter``, the conversation's) passes the budget's
    limit less ``BATCH_MARGIN``. Needs the conversation's envelopes so far."""
    if not envelopes:
        raise ConfigError("layout", "batched needs at least one envelope")
    if envelopes[-1].batch is not None:  # the conversation batched it: the request it sends
        return attrs.evolve(default_prompt(envelopes[-1]), layout="batched")
    if counter is None:
        raise ConfigError("layout", "batched needs the conversation's token counter")
    batch = _settle(0, envelopes[0], counter)
    for i in range(1, len(envelopes)):
        env, base = envelopes[i], envelopes[batch.start]
        if (
            [s.text for s in env.l1.segments] != [s.text for s in base.l1.segments]
            or not _l2_extends(base, env)
            or not _history_extends(base, envelopes[batch.start : i], env)
        ):
            batch = _settle(i, env, counter)
            continue
        messages, tokens = list(batch.messages), batch.tokens
        reply = _replies(env).get(envelopes[i - 1].turn)
        if reply is not None:
            messages.append(Message("assistant", (Block(reply),)))
            tokens += counter.count(reply) + _PER_MESSAGE
        sent = dict(batch.sent)
        text = _append_user_text(env, sent)
        tokens += counter.count(text) + _PER_MESSAGE
        budget = env.report.budget
        if budget is not None and tokens + _PER_MESSAGE > budget.limit * (1 - BATCH_MARGIN):
            batch = _settle(i, env, counter)
            continue
        messages.append(Message("user", (Block(text),)))
        batch = _Batch(batch.start, batch.system, tuple(messages), tuple(sent.items()), tokens)
    out = list(batch.messages)
    out[-1] = Message("user", (Block(out[-1].text, TURN_END),))
    if len(out) > 1:
        out[-2] = Message(out[-2].role, (Block(out[-2].text, HISTORY_END),))
    return Prompt("batched", envelopes[-1].turn, batch.system, tuple(out))


def build_prompt(
    envelopes: Sequence[Envelope],
    layout: Layout = "default",
    counter: TokenCounter | None = None,
) -> Prompt:
    """The prompt for the last envelope in ``layout`` (earlier envelopes feed append-only
    and naive; the default layout needs only the last)."""
    if not envelopes:
        raise ConfigError("layout", "no envelope to build a prompt from")
    if layout == "default":
        return default_prompt(envelopes[-1])
    if layout == "batched":
        return batched_prompt(envelopes, counter)
    if layout == "append-only":
        return append_only_prompt(envelopes)
    if layout == "naive":
        return naive_prompt(envelopes)
    raise ConfigError("layout", f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
