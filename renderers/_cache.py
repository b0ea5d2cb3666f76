"""Prefix-change reports: how much of each request repeats the previous one, and why not more.

A break is any change to bytes the previous request had made cacheable: its system
message (L1 + L2) must be a byte prefix of this one's, and its history a prefix of this
history. Growth (a longer library, more history) is not a break.

Every figure is in the request's own count (``lamina.pipeline.tokens.request_tokens``:
contents plus the chat framing per message and to prime the reply, or Mistral's instruct
format), for any layout's ``Prompt``: the cached prefix is the tokens of the leading
messages the previous request sent byte for byte plus the shared start of the first
message that differs, so it is never above the request it is part of. Provider-specific
figures (minimum cacheable prefixes, 128-token steps, Anthropic's breakpoints) are the
simulator's, labelled as such.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from lamina.pipeline import Budget, Decision, DecisionAction, Envelope
from lamina.pipeline.layout import QUERY_LABEL
from lamina.pipeline.tokens import TokenCounter
from lamina.renderers._layouts import Prompt, default_prompt
from lamina.renderers._openai import (
    ChatMessage,
    chatml,
    chatml_prefix_tokens,
    common_prefix_length,
    openai_messages,
)

__all__ = [
    "PREVIOUS_NOT_REBUILT",
    "PrefixReport",
    "classify_break",
    "prefix_report",
    "prefix_reports",
    "prompt_prefix_tokens",
    "prompt_tokens",
]

# Readers match a decision's action, never its reason's words (those are for people).
_CHANGED = frozenset({DecisionAction.REFRESHED, DecisionAction.PINNED})
_EVICTED = frozenset({DecisionAction.EVICTED, DecisionAction.DROPPED})

PREVIOUS_NOT_REBUILT = "previous-not-rebuilt"
"""The break reason of a turn whose previous request is not known (a stored turn that
cannot be rebuilt as it was sent): not the chat's first request, yet nothing to compare."""


@attrs.frozen
class PrefixReport:
    """One turn's cache view: L1/L2 hashes, the prefix shared with the previous request
    (OpenAI chat serialization), and the classified reasons it broke (empty: no break)."""

    turn: int
    l1_hash: str
    l2_hash: str
    common_prefix_tokens: int
    common_prefix_bytes: int
    reasons: tuple[str, ...]

    @property
    def break_reason(self) -> str | None:
        """The first (earliest in the request) reason, or None when nothing broke."""
        return self.reasons[0] if self.reasons else None

    def trace(self) -> dict[str, Any]:
        """The ``"cache"`` entry of a JSON trace turn."""
        return {
            "common_prefix_tokens": self.common_prefix_tokens,
            "break_reason": self.break_reason,
        }


def _l2_reasons(previous: Envelope, current: Envelope) -> list[str]:
    reasons: list[str] = []
    for d in current.report.decisions:
        if d.layer != "L2":
            continue
        if d.action in _CHANGED:
            reasons.append(f"artifact-changed:{d.target}")
        elif d.action in _EVICTED:
            reasons.append(f"l2-evicted:{d.target}")
        else:
            reasons.append(f"l2-compacted:{d.target}")
    kept: list[str] = []
    for seg in previous.l2.segments:
        now = current.l2.get(seg.key)
        if now is None:
            kept.append(f"l2-evicted:{seg.key}")
        elif now.content_hash != seg.content_hash:
            kept.append(f"artifact-changed:{seg.key}")
        elif now.form != seg.form:
            kept.append(f"l2-compacted:{seg.key}")
        elif now.text != seg.text:
            kept.append(f"l2-changed:{seg.key}")
    before = previous.l2.keys()
    order = [k for k in current.l2.keys() if k in before]  # noqa: SIM118
    if not kept and order != [k for k in before if k in order]:
        kept.append("l2-reordered")
    reasons.extend(r for r in kept if r not in reasons)
    return reasons


def classify_break(previous: Envelope | None, current: Envelope) -> tuple[str, ...]:
    """Why ``current`` does not extend what ``previous`` made cacheable (``_classify``),
    with ``instructions-changed`` before any history reason when a framework's own
    instructions, sent after the system message, changed (a decision the adapter records:
    the envelopes alone do not show it)."""
    reasons = _classify(previous, current)
    if previous is None or not any(
        d.action is DecisionAction.INSTRUCTIONS_CHANGED for d in current.report.decisions
    ):
        return reasons
    later = ("history-cut-moved", "library-settled", "library-shed")
    head = tuple(r for r in reasons if r not in later)
    return (*head, "instructions-changed", *(r for r in reasons if r in later))


def _classify(previous: Envelope | None, current: Envelope) -> tuple[str, ...]:
    """Why ``current`` does not extend what ``previous`` made cacheable, earliest first:
    ``first-turn``, ``system-changed``, ``memory-changed`` (``handoff`` when an agent
    loop's handoff changed it, or ``previous`` was sent after one and ``current`` has no
    L1 decision of its own), ``artifact-changed:<key>``,
    ``l2-compacted:<key>``, ``l2-evicted:<key>``, ``history-cut-moved`` (or ``unknown``),
    ``library-settled`` when a batched request settled the library's deferred growth,
    ``library-shed`` when it re-sent that growth's messages from the first block whose
    entry the budget changed (the system message kept);
    empty when the previous system message and history are kept byte for byte (as sent:
    ``Envelope.as_sent``)."""
    if previous is None:
        return ("first-turn",)
    if previous.batch is not None or current.batch is not None:
        before, after = _as_sent(_sent(previous)), _as_sent(_sent(current))
        old_history = before.history()
        if after.system_text.startswith(before.system_text) and (
            after.history()[: len(old_history)] == old_history
        ):
            return ()
        # What the envelopes as built changed; else the deferred library growth settled,
        # or (the system message kept, the batch extended) its messages were re-sent from
        # the first block whose entry the budget changed: the batch shed.
        shed = (
            current.batch is not None
            and not current.batch.reason
            and after.system_text.startswith(before.system_text)
        )
        return _built_reasons(previous, current) or ("library-shed" if shed else "library-settled",)
    return _built_reasons(previous, current) or ()


def _built_reasons(previous: Envelope, current: Envelope) -> tuple[str, ...]:
    reasons: list[str] = []
    system_kept = current.system_text.startswith(previous.system_text)
    if not system_kept:
        for key, name in (
            ("system:stable", "system-changed"),
            ("system:mutable", "memory-changed"),
        ):
            before, after = previous.l1.get(key), current.l1.get(key)
            if (before.text if before else "") != (after.text if after else ""):
                handed = _handed(current, previous)
                reasons.append("handoff" if name == "memory-changed" and handed else name)
        reasons.extend(_l2_reasons(previous, current))
    old, new = previous.history(), current.history()
    if new[: len(old)] != old:
        reasons.append("history-cut-moved")
    if not system_kept and not reasons:
        reasons.append("unknown")
    return tuple(reasons)


def _handed(current: Envelope, previous: Envelope) -> bool:
    """Whether a handoff changed L1's mutable part between the two requests: ``current``'s
    last L1 decision is one, or ``current`` has none and ``previous``'s last is (a loop's
    next turn starts with its first agent's instructions again)."""
    last = _last_l1(current)
    if last is None:
        last = _last_l1(previous)
    return last is not None and last.action is DecisionAction.HANDOFF


def _last_l1(envelope: Envelope) -> Decision | None:
    return next((d for d in reversed(envelope.report.decisions) if d.layer == "L1"), None)


def _common_prefix_bytes(a: str, b: str) -> int:
    """Length of the common prefix of the UTF-8 encodings, without encoding either whole."""
    chars = common_prefix_length(a, b)
    size = len(a[:chars].encode("utf-8", "surrogatepass"))
    if chars < min(len(a), len(b)):  # two characters can share leading bytes
        size += common_prefix_length(
            a[chars].encode("utf-8", "surrogatepass"), b[chars].encode("utf-8", "surrogatepass")
        )
    return size


# --- counting a prompt as the request counts it -------------------------------------

# Blocks start with ``<`` after a blank line, and so does the labelled query: split there,
# the blocks' counts (remembered since the build) add up and only the query is encoded.
_BLOCK_SPLIT = re.compile(r"\n\n(?=<|" + re.escape(QUERY_LABEL) + ")")
_MISTRAL_REPLY_END = 1  # the ``</s>`` after each reply (pipeline's MISTRAL_REPLY_END)


@attrs.frozen
class _Framing:
    """The framing fields the counts need (a budget's, else OpenAI's 3 + 3)."""

    per_message: int = 3
    priming: int = 3
    lead: str = ""
    trim: bool = False
    template: str = "messages"


def _framing(budget: Budget | None) -> _Framing:
    if budget is None:
        return _Framing()
    f = budget.framing
    return _Framing(f.per_message, f.priming, f.lead, f.trim, f.template)


def _text_tokens(text: str, counter: TokenCounter) -> int:
    """Exact tokens of ``text`` from the remembered counts of its blocks: after a blank
    line a block's ``<`` (or the query label's ``-``) always starts a new piece, so the
    count adds up over them (``count_joined`` counts the text whole where it would not)."""
    parts = _BLOCK_SPLIT.split(text)
    if len(parts) == 1 or not all(parts):
        return counter.count(text)
    return counter.count_joined(parts)


def _content(text: str, counter: TokenCounter, fr: _Framing) -> int:
    """A message content's tokens as ``request_tokens`` counts them (lead, trim)."""
    if fr.trim and text != text.strip():
        text = text.strip()
    if fr.lead and text[:1].isspace():  # lead and content may share a piece
        return counter.count(fr.lead + text) - counter.count(fr.lead)
    return _text_tokens(text, counter)


@attrs.frozen
class _Unit:
    """One run of a request that is cached whole or not at all: a message with its
    framing (or, for Mistral, one ``[INST]`` turn with its reply); ``text`` is what must
    repeat for it to be shared, ``role`` whether a partial match may count."""

    role: str
    text: str
    tokens: int
    partial: bool = True


def _units(prompt: Prompt, counter: TokenCounter, fr: _Framing) -> tuple[list[_Unit], int]:
    """The request's units in order and the tokens outside them (reply priming)."""
    if fr.template == "mistral":
        return _mistral_units(prompt, counter, fr), 0
    units = [
        _Unit(role, text, _content(text, counter, fr) + fr.per_message)
        for role, text in prompt.chat()
    ]
    return units, fr.priming


def _mistral_units(prompt: Prompt, counter: TokenCounter, fr: _Framing) -> list[_Unit]:
    """Mistral's instruct format: ``<s>``, each user turn with its reply, then the last
    turn, which the system text opens (so it never repeats: ``partial=False``)."""
    units = [_Unit("start", "", fr.priming, partial=False)]
    pending: list[str] = []
    for message in prompt.messages:
        if message.role == "user":
            pending.append(message.text)
            continue
        reply = message.text.rstrip(" ")
        joined = counter.count_joined(pending) if pending else 0
        tokens = fr.per_message + joined + counter.count(reply) + _MISTRAL_REPLY_END
        units.append(_Unit("turn", "\x00".join([*pending, reply]), tokens, partial=False))
        pending = []
    last = [t for t in (prompt.system_text, *pending) if t]
    units.append(_Unit("last", "\x00".join(last), fr.per_message + counter.count_joined(last)))
    return units


def prompt_tokens(prompt: Prompt, counter: TokenCounter, budget: Budget | None = None) -> int:
    """Exact tokens of the request ``prompt`` renders, counted as ``request_tokens`` counts
    an envelope (``budget``'s framing, else OpenAI's): for the default layout the two are
    equal, and every layout is counted in that one unit."""
    fr = _framing(budget)
    units, rest = _units(prompt, counter, fr)
    return rest + sum(u.tokens for u in units)


def prompt_prefix_tokens(
    previous: Prompt | None, current: Prompt, counter: TokenCounter, budget: Budget | None = None
) -> int:
    """The tokens at the start of ``current`` that repeat ``previous`` byte for byte, in
    ``prompt_tokens``' unit, so never above it: the messages sent the same way whole (with
    their framing), then the shared tokens of the first message that differs (its framing
    not counted). Provider rules (minimums, steps) are not applied here."""
    if previous is None:
        return 0
    fr = _framing(budget)
    before, _ = _units(previous, counter, fr)
    after, _ = _units(current, counter, fr)
    return _shared_tokens(before, after, counter, fr)


def prefix_report(
    previous: Envelope | None,
    current: Envelope,
    counter: TokenCounter,
    *,
    budget: Budget | None = None,
) -> PrefixReport:
    """The report for ``current`` given the request before it (None on the first turn);
    ``common_prefix_tokens`` is in the request's own count (``prompt_prefix_tokens`` of the
    default layout, with ``budget``'s framing when given)."""
    tokens = same = 0
    if previous is not None:
        before, after = _sent(previous), _sent(current)
        tokens = _prefix_tokens(before, after, counter, _framing(budget))
        same = _prefix_bytes(before, after)
    return PrefixReport(
        turn=current.turn,
        l1_hash=current.l1.hash,
        l2_hash=current.l2.hash,
        common_prefix_tokens=tokens,
        common_prefix_bytes=same,
        reasons=classify_break(previous, current),
    )


# --- the same figures, each message rendered and counted once per envelope -------------
#
# A report compares a request with the one before it, and in a conversation each request
# is the next report's previous one: so what a request renders to (``as_sent``, its chat
# and message list) and each message's tokens and UTF-8 size are kept per envelope (by
# identity, weakly, the 32 last used at most), and a message the next request repeats
# passes its figures on. Each message is then rendered and counted once however many
# reports it takes part in, and a request that extends the one before (a batch extension)
# counts nothing of the prefix again. The figures are those of ``prompt_prefix_tokens``
# over ``default_prompt`` and of the two requests' ``chatml`` strings, exactly.

# Two envelopes a conversation (the previous request and this one) for 16 conversations
# served at once; an entry goes as soon as its envelope does.
_MEMO_SIZE = 32


@attrs.define(eq=False)
class _Counted:
    """One envelope's default-layout units under one framing and counter: (role, text)
    whole messages with tokens filled in when first needed (or passed on by the request
    before, whose same message has the same count), or Mistral's units counted whole."""

    counter: TokenCounter
    chat: list[tuple[str, str]]
    tokens: list[int | None]
    mistral: list[_Unit] | None = None


@attrs.define(eq=False)
class _Sent:
    """What one envelope is sent as, computed once: ``as_sent``, the OpenAI message list
    (with each message's ``chatml`` UTF-8 size once known), the default prompt's chat and
    its counts per framing and counter."""

    # ``as_sent``, held weakly when it is the envelope itself (nothing deferred), so the
    # memo never keeps an envelope alive.
    _sent: Callable[[], Envelope | None]
    _messages: list[ChatMessage] | None = None
    sizes: list[int | None] = attrs.Factory(list)
    prompt: Prompt | None = None
    counted: dict[tuple[_Framing, int], _Counted] = attrs.Factory(dict)


_MEMO: dict[int, tuple[weakref.ref[Envelope], _Sent]] = {}


def _sent(envelope: Envelope) -> _Sent:
    key = id(envelope)
    hit = _MEMO.pop(key, None)
    if hit is not None and hit[0]() is envelope:
        _MEMO[key] = hit  # the most recently used last
        return hit[1]
    sent = envelope.as_sent()
    memo = _Sent(weakref.ref(sent) if sent is envelope else lambda: sent)
    while len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)), None)
    _MEMO[key] = (weakref.ref(envelope, _forget(key, _MEMO)), memo)
    return memo


def _forget(
    key: int, entries: dict[int, tuple[weakref.ref[Envelope], _Sent]]
) -> Callable[[weakref.ref[Envelope]], None]:
    """Drop ``key``'s entry when its envelope is collected (if the entry is still its)."""

    def gone(ref: weakref.ref[Envelope]) -> None:
        hit = entries.get(key)
        if hit is not None and hit[0] is ref:
            entries.pop(key, None)

    return gone


def _as_sent(memo: _Sent) -> Envelope:
    sent = memo._sent()
    assert sent is not None  # the memo is only reached through its live envelope
    return sent


def _messages(memo: _Sent) -> list[ChatMessage]:
    if memo._messages is None:
        memo._messages = openai_messages(_as_sent(memo))
        memo.sizes = [None] * len(memo._messages)
    return memo._messages


def sent_messages(envelope: Envelope) -> list[ChatMessage]:
    """``openai_messages(envelope)`` from the envelope's memo (new dicts, free to change), so
    the trace turn and the cache report render the request once between them."""
    return [ChatMessage(role=m["role"], content=m["content"]) for m in _messages(_sent(envelope))]


def _prompt(memo: _Sent) -> Prompt:
    if memo.prompt is None:
        memo.prompt = default_prompt(_as_sent(memo))  # its own ``as_sent``
    return memo.prompt


def _counted(memo: _Sent, counter: TokenCounter, fr: _Framing) -> _Counted:
    key = (fr, id(counter))
    got = memo.counted.get(key)
    if got is not None and got.counter is counter:
        return got
    prompt = _prompt(memo)
    if fr.template == "mistral":
        units = _mistral_units(prompt, counter, fr)
        got = _Counted(counter, [], [u.tokens for u in units], units)
    else:
        chat = prompt.chat()
        got = _Counted(counter, chat, [None] * len(chat))
    memo.counted[key] = got
    return got


def _unit_tokens(c: _Counted, i: int, fr: _Framing) -> int:
    t = c.tokens[i]
    if t is None:
        t = c.tokens[i] = _content(c.chat[i][1], c.counter, fr) + fr.per_message
    return t


def _prefix_tokens(before: _Sent, after: _Sent, counter: TokenCounter, fr: _Framing) -> int:
    """``prompt_prefix_tokens(default_prompt(previous), default_prompt(current), ...)``."""
    old, new = _counted(before, counter, fr), _counted(after, counter, fr)
    if old.mistral is not None and new.mistral is not None:
        return _shared_tokens(old.mistral, new.mistral, counter, fr)
    shared = 0
    for i, (a, b) in enumerate(zip(old.chat, new.chat, strict=False)):
        if a == b:
            t = _unit_tokens(old, i, fr)
            if new.tokens[i] is None:  # the same text under the same framing and counter
                new.tokens[i] = t
            shared += t
            continue
        if a[0] == b[0]:
            x, y = (a[1].strip(), b[1].strip()) if fr.trim else (a[1], b[1])
            if common_prefix_length(x, y):
                part = chatml_prefix_tokens(x, y, counter)
                shared += min(part, _unit_tokens(new, i, fr) - fr.per_message)
        break
    return shared


def _shared_tokens(
    before: list[_Unit], after: list[_Unit], counter: TokenCounter, fr: _Framing
) -> int:
    """The shared tokens of two unit lists (``prompt_prefix_tokens``' loop)."""
    shared = 0
    for old, new in zip(before, after, strict=False):
        if old.role == new.role and old.text == new.text:
            shared += new.tokens
            continue
        if old.role == new.role and new.partial and old.partial:
            a, b = (old.text.strip(), new.text.strip()) if fr.trim else (old.text, new.text)
            if common_prefix_length(a, b):
                part = chatml_prefix_tokens(a, b, counter)
                shared += min(part, new.tokens - fr.per_message)
        break
    return shared


def _size(memo: _Sent, i: int) -> int:
    n = memo.sizes[i]
    if n is None:
        piece = chatml(_messages(memo)[i : i + 1])
        n = memo.sizes[i] = len(piece.encode("utf-8", "surrogatepass"))
    return n


def _prefix_bytes(before: _Sent, after: _Sent) -> int:
    """``_common_prefix_bytes`` of the two requests' ``chatml``: the messages sent again
    whole by their sizes, then only the tails from the first that differs compared."""
    a, b = _messages(before), _messages(after)
    i = 0
    size = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        n = _size(before, i)
        if after.sizes[i] is None:
            after.sizes[i] = n
        size += n
        i += 1
    return size + _common_prefix_bytes(chatml(a[i:]), chatml(b[i:]))


def prefix_reports(
    envelopes: Sequence[Envelope], counter: TokenCounter, *, budget: Budget | None = None
) -> list[PrefixReport]:
    """One report per envelope of a conversation, in order."""
    out: list[PrefixReport] = []
    previous: Envelope | None = None
    for env in envelopes:
        out.append(prefix_report(previous, env, counter, budget=budget))
        previous = env
    return out
