"""The library's growth deferred to the next prefix break: what a conversation keeps
between turns to send each request as a byte extension of the one before.

A turn's new attachments enter L2 (the system message) at the next turn, so with the
library in the system message every history message after it leaves the cached prefix
each time the library grows. Batching keeps the system message as it was settled and
lets each turn's context stay in the user message that sent it (as append-only does:
full blocks the first time, references to what was sent earlier or sits in the settled
library) until the prefix breaks anyway (L1 changed; an L2 entry compacted, evicted,
refreshed or reordered; history cut) or the batched request would not fit the budget.
Then the request settles: it is the envelope as built, library included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
import xxhash

from lamina.pipeline._budget.index import INDEX_SOURCE
from lamina.pipeline._hashing import hash_joined, slice_hash, text_hash
from lamina.pipeline._model.envelope import (
    BLOCK_SEP,
    QUERY_LABEL,
    Batch,
    DecisionAction,
    Envelope,
    Form,
    Segment,
    View,
    arrange_user,
    user_blocks,
)
from lamina.pipeline._model.recall import RECALL_SOURCE
from lamina.pipeline._model.tools import TOOL_SOURCE, chunk_source
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._turn.measure import joined_tokens, user_tokens
from lamina.pipeline._views.views import SegmentRenderer

__all__ = [
    "APPEND_REFERENCES_INTRO",
    "FIRST_TURN",
    "GIVEN_BACK",
    "HISTORY_CHANGED",
    "NO_BATCH",
    "OVER_BUDGET",
    "RESTORED_INTRO",
    "SYSTEM_CHANGED",
    "BatchState",
    "DeferredTurn",
    "append_parts",
    "batch_turn",
    "choose_restores",
    "segment_reference",
    "shed_keys",
    "stale_key",
]

APPEND_REFERENCES_INTRO = (
    "Context attached to this message (sent in full earlier in this conversation):"
)

RESTORED_INTRO = (
    "Context Library entries sent whole again (they stand for the shorter forms the "
    "Context Library shows under the same keys):"
)

Whole = tuple[int, Callable[[], Segment]]
"""A cut library entry that may be sent whole again: its full block's size when it entered
the library, and how to render its whole form (only when chosen)."""
Wholes = Callable[[int, int, Mapping[str, str]], Sequence[Whole]]
"""The cut entries among the first ``settled`` of the library whose full blocks were at
most ``room`` tokens, leaving out those ``sent`` in full (key -> content hash)."""

# Why a request settled (``Batch.reason``).
FIRST_TURN = "first-turn"
SYSTEM_CHANGED = "system-changed"
HISTORY_CHANGED = "history-changed"
OVER_BUDGET = "over-budget"
# The budget gave back an entry of the library's growth a deferred message sent cut.
GIVEN_BACK = "given-back"
# No batch to extend: a state saved without one, or the turn after an agent loop's.
NO_BATCH = "no-batch"


@attrs.frozen
class DeferredTurn:
    """One turn of the current batch: its number, its query as L4 shows it, the blocks of
    the user message it was sent with (context included; kept as blocks, which share their
    strings with the views, so the batch holds no second copy of a large attachment) and
    that message's exact tokens, its reply once L4 shows it (None before), and the keys of
    the library's growth its blocks send (``_shed``)."""

    turn: int
    query: str
    blocks: tuple[str, ...]
    tokens: int
    reply: str | None = None
    keys: tuple[str, ...] = ()
    """The key of the library entry each block sends (this turn's context: its growth),
    "" for the others; () in a state saved before keys were kept (nothing is shed)."""

    @property
    def text(self) -> str:
        return BLOCK_SEP.join(self.blocks)


@attrs.frozen
class BatchState:
    """Where the current batch settled and what it sent since, kept between turns (and
    saved with ``ConversationState``).

    ``settled`` L2 entries (``library_tokens`` joined, layer hash ``library_hash``) were in
    the system message of the
    settling request (L1's blocks hash to ``l1_hash``; its first ``system_chars``
    characters to ``system_hash``); its history was the first ``history`` L4 segments
    (``history_hash``); ``turns`` are the turns sent since, the settling one first; ``sent``
    what their messages sent in full (key -> content hash, in the order first sent)."""

    settled: int = 0
    library_tokens: int = 0
    library_hash: str = ""
    l1_hash: str = ""
    system_chars: int = 0
    system_hash: str = ""
    history: int = 0
    history_hash: str = ""
    turns: tuple[DeferredTurn, ...] = ()
    sent: tuple[tuple[str, str], ...] = ()


def _history_hash(segments: Sequence[Segment]) -> str:
    return hash_joined(
        xxhash.xxh3_128(), (f"{s.role}\x00{s.key}\x00{s.text}" for s in segments), "\x01"
    ).hexdigest()


def _scoped(segment: Segment) -> bool:
    """A retrieval chunk or a recalled block: this turn's only, never recorded as sent."""
    return segment.source_type == RECALL_SOURCE or chunk_source(segment.key) is not None


Part = tuple[str, Segment | None]


def _grows(envelope: Envelope) -> set[int]:
    """The ids of this turn's context segments the library takes in (its growth): not
    references, tool results, retrieval chunks, recalled blocks or a group's index."""
    return {
        id(s)
        for s in envelope.l3.segments
        if s.form is not Form.REFERENCE
        and s.source_type not in (TOOL_SOURCE, INDEX_SOURCE)
        and not _scoped(s)
    }


def _deferred(
    envelope: Envelope, parts: Sequence[Part], tokens: int, counter: TokenCounter
) -> DeferredTurn:
    """This turn as the batch keeps it: the blocks (and their exact tokens) of its user
    message as later requests carry it, without its recalled blocks, which belong to this
    turn only (the next request's cached prefix ends before this message instead of
    carrying them on), each with the key of the library entry it sends ("" for others)."""
    scoped = {s.text for s in envelope.l3.segments if s.source_type == RECALL_SOURCE}
    grows = _grows(envelope)
    kept = [(t, s) for t, s in parts if t not in scoped]
    keys = tuple(s.key if s is not None and id(s) in grows else "" for _, s in kept)
    blocks = tuple(t for t, _ in kept)
    if len(kept) != len(parts):
        if len(kept) == 1 and blocks[0] == QUERY_LABEL + envelope.query:
            kept = [(envelope.query, None)]  # the query alone is not labelled
        blocks, tokens = _counted(kept, counter)
    return DeferredTurn(envelope.turn, envelope.query, blocks, tokens, keys=keys)


def segment_reference(segment: Segment) -> View:
    """The reference to ``segment`` (a block sent in full before): its key, title, locator
    and content hash, no body."""
    return View(
        key=segment.key,
        source_type=segment.source_type,
        form=Form.REFERENCE,
        title=segment.title,
        locator=segment.locator,
        recoverable=segment.recoverable,
        content_hash=segment.content_hash,
        attributes=segment.attributes,
    )


def _reference(segment: Segment, renderer: SegmentRenderer) -> str:
    return renderer.render(segment_reference(segment))


def append_parts(
    envelope: Envelope,
    sent: dict[str, str],
    settled: Callable[[str], str | None],
    reference: Callable[[Segment], str],
    restored: Sequence[Segment] = (),
) -> list[tuple[str, Segment | None]]:
    """This turn's user message when context stays where it was first sent: its blocks in
    the one order of a user message (``arrange_user``), each with the segment it came from
    (None for the query); records in ``sent`` what it sends in full. ``settled(key)`` is
    the content hash of a settled library entry; ``reference(segment)`` renders the
    reference to a block sent in full before. The append-only layout and the batch share it.

    Tool results, retrieval chunks and recalled blocks are never recorded as sent: they
    belong to this turn (a chunk the pipeline made a reference points at its source entry,
    sent in full earlier). What the budget did not send is listed as such, not recorded.
    ``restored``: cut library entries sent whole again (``choose_restores``), under
    ``RESTORED_INTRO`` after this turn's context, recorded as sent.
    """
    segments = envelope.l3.segments
    tools: list[Part] = [(s.text, s) for s in segments if s.source_type == TOOL_SOURCE]
    refs: list[str] = []
    unsent: list[str] = []
    full: list[Part] = []
    for seg in segments:
        if seg.source_type == TOOL_SOURCE:
            continue
        if seg.form is Form.REFERENCE and seg.unsent:
            unsent.append(seg.text)
        elif chunk_source(seg.key) and seg.form is Form.REFERENCE:
            refs.append(seg.text)
        elif _scoped(seg):
            full.append((seg.text, seg))
        elif seg.form is Form.REFERENCE:
            if (sent.get(seg.key) or settled(seg.key)) == seg.content_hash:
                refs.append(seg.text)
                continue
            # Refreshed in L2 since it was sent: the earlier message holds old bytes.
            entry = envelope.l2.get(seg.key)
            full.append((entry.text, entry) if entry is not None else (seg.text, seg))
            sent[seg.key] = seg.content_hash
        elif seg.form is Form.FULL and (sent.get(seg.key) or settled(seg.key)) == (
            seg.content_hash
        ):
            refs.append(reference(seg))
        else:
            full.append((seg.text, seg))
            if seg.form is Form.FULL:
                sent[seg.key] = seg.content_hash
    if restored:
        full += _restored_parts(envelope, restored)
        sent.update((seg.key, seg.content_hash) for seg in restored)
    return arrange_user(
        tools, refs, unsent, full, (envelope.query, None), refs_intro=APPEND_REFERENCES_INTRO
    )


def append_user(
    envelope: Envelope,
    sent: dict[str, str],
    settled: Callable[[str], str | None],
    renderer: SegmentRenderer,
    counter: TokenCounter,
    restored: Sequence[Segment] = (),
) -> tuple[list[Part], int]:
    """``append_parts`` with the conversation's renderer, and the message's exact tokens
    (a block the envelope measured is not counted again)."""
    reference = lambda seg: _reference(seg, renderer)  # noqa: E731
    parts = append_parts(envelope, sent, settled, reference, restored)
    return parts, _counted(parts, counter)[1]


def _counted(
    parts: Sequence[tuple[str, Segment | None]], counter: TokenCounter
) -> tuple[tuple[str, ...], int]:
    """A user message's blocks and its exact tokens (a measured block is not counted again)."""
    if not parts:
        return (), 0
    known = [
        (t, s.tokens if s is not None and s.text == t else counter.count(t), None) for t, s in parts
    ]
    return tuple(t for t, _ in parts), joined_tokens(known, counter)


def choose_restores(
    candidates: Sequence[Whole],
    room: int,
    counter: TokenCounter,
    shown: Callable[[str], bool],
) -> list[Segment]:
    """The cut library entries to send whole again within ``room`` tokens, in library order:
    the largest first (so no entry stays cut whose whole form alone would fit), each
    costing its tokens and a separator, and the intro once if one of them the library
    ``shown`` in a block of its own (``_restored_parts``). A candidate is the size its
    full block had and how to render its whole form, so only those that may fit are
    rendered."""
    if not candidates:
        return []
    intro = counter.count(RESTORED_INTRO) + 2
    left, introduced = room, False
    taken: list[tuple[int, Segment]] = []
    order = sorted(range(len(candidates)), key=lambda i: (-candidates[i][0], i))
    for i in order:
        size, render = candidates[i]
        if size + 2 > left:
            continue
        seg = render()
        needs = shown(seg.key) and not introduced
        cost = seg.tokens + 2 + (intro if needs else 0)
        if cost <= left:
            taken.append((i, seg))
            left -= cost
            introduced |= needs
    return [seg for _, seg in sorted(taken, key=lambda c: c[0])]


def _shown(envelope: Envelope, key: str) -> bool:
    """Whether the library shows ``key`` in a block of its own (a shorter form a block sent
    whole again stands for); an entry folded into an index, a line or set aside, has none."""
    seg = envelope.l2.get(key)
    return seg is not None and bool(seg.text)


def _restored_parts(envelope: Envelope, restored: Sequence[Segment]) -> list[Part]:
    """``restored`` as user-message blocks: those the library shows in a shorter block of
    their own under ``RESTORED_INTRO`` (they stand for it); the others, folded into an
    index, before it, as context (no block of theirs says otherwise)."""
    plain: list[Part] = []
    again: list[Part] = []
    for seg in restored:
        (again if _shown(envelope, seg.key) else plain).append((seg.text, seg))
    return [*plain, *([(RESTORED_INTRO, None), *again] if again else [])]


def _with_restored(
    envelope: Envelope, restored: Sequence[Segment]
) -> list[tuple[str, Segment | None]]:
    """The settling request's user message (the envelope's) with ``restored`` sent whole
    after its context, before the query (labelled, as anything precedes it)."""
    parts = user_blocks(envelope.l3, envelope.l5)
    if not restored:
        return parts
    query = parts.pop()
    if not parts:
        query = (QUERY_LABEL + query[0], None)
    return [*parts, *_restored_parts(envelope, restored), query]


def _settle(
    envelope: Envelope,
    counter: TokenCounter,
    tokens: int,
    reason: str,
    restored: Sequence[Segment] = (),
) -> tuple[Envelope, BatchState]:
    """The envelope as built (with ``restored`` sent whole in its user message), and the
    batch it starts."""
    l2 = envelope.l2.segments
    sent = {
        s.key: s.content_hash
        for s in (*envelope.l3.segments, *restored)
        if s.form is Form.FULL and s.source_type != TOOL_SOURCE and not _scoped(s)
    }
    if restored:
        parts = _with_restored(envelope, restored)
        blocks, size = _counted(parts, counter)
        user = _message(f"history:{envelope.turn}:user", "history", BLOCK_SEP.join(blocks), size)
    else:
        parts = user_blocks(envelope.l3, envelope.l5)
        user = _message(
            f"history:{envelope.turn}:user",
            "history",
            envelope.user_text,
            user_tokens(envelope, counter),
        )
    state = BatchState(
        settled=len(l2),
        library_tokens=envelope.l2.tokens,
        library_hash=envelope.l2.hash,
        l1_hash=_l1_hash(envelope),
        system_chars=len(envelope.system_text),
        system_hash=envelope.prefix_hash,
        history=len(envelope.l4.segments),
        history_hash=_history_hash(envelope.l4.segments),
        turns=(_deferred(envelope, parts, user.tokens, counter),),
        sent=tuple(sent.items()),
    )
    batch = Batch(
        len(l2),
        envelope.l2.tokens,
        (),
        user,
        tokens,
        reason,
        system_hash=envelope.prefix_hash,
        library_hash=envelope.l2.hash,
        system=envelope.system_text,
        restored=tuple(restored),
    )
    return attrs.evolve(envelope, batch=batch), state


def _settled(
    envelope: Envelope,
    counter: TokenCounter,
    count: Callable[[Envelope], int],
    fits: Callable[[int], bool],
    reason: str,
    room: Callable[[int], int],
    wholes: Wholes,
) -> tuple[Envelope, BatchState]:
    """``_settle`` with the cut library entries whose whole forms fit the room the request
    leaves sent whole in its user message (restore by appending, as a batched turn does)."""
    tokens = count(envelope)
    free = room(tokens)
    if free > 0:
        sent = {s.key: s.content_hash for s in envelope.l3.segments if s.form is Form.FULL}
        candidates = wholes(len(envelope.l2.segments), free, sent)
        restored = choose_restores(candidates, free, counter, lambda k: _shown(envelope, k))
        if restored:
            env, state = _settle(envelope, counter, tokens, reason, restored)
            used = count(env)
            if fits(used) and env.batch is not None:
                return attrs.evolve(env, batch=attrs.evolve(env.batch, tokens=used)), state
    return _settle(envelope, counter, tokens, reason)


def _message(key: str, kind: str, text: str, tokens: int) -> Segment:
    """A user message of the batched request as a history segment."""
    return Segment(
        key=key,
        form=Form.TEXT,
        source_type=kind,
        content_hash=text_hash(text),
        text=text,
        tokens=tokens,
        role="user",
    )


def _reuse(segment: Segment | None, turn: DeferredTurn) -> Segment | None:
    """The last request's message for ``turn``, if it is that turn's (same blocks)."""
    if segment is None or segment.tokens != turn.tokens:
        return None
    size = sum(map(len, turn.blocks)) + len(BLOCK_SEP) * max(len(turn.blocks) - 1, 0)
    return segment if len(segment.text) == size else None


def _l1_hash(envelope: Envelope) -> str:
    return hash_joined(
        xxhash.xxh3_128(), (f"{s.key}\x00{s.text}" for s in envelope.l1.segments), "\x01"
    ).hexdigest()


def _extends(
    state: BatchState, envelope: Envelope, settled: str | None
) -> tuple[str, tuple[DeferredTurn, ...]]:
    """Why ``envelope`` cannot extend the batch ("" when it can), and the batch's turns
    with the reply L4 now shows for the last one. ``settled`` is the settled system message
    when known (compared, not hashed)."""
    system = envelope.system_text
    chars = state.system_chars
    if settled is not None and len(settled) == chars:
        same = system.startswith(settled)
    else:
        same = len(system) >= chars and slice_hash(system, 0, chars) == state.system_hash
    if (
        not same
        or _l1_hash(envelope) != state.l1_hash
        or (chars and len(system) > chars and not system.startswith(BLOCK_SEP, chars))
    ):
        return SYSTEM_CHANGED, state.turns
    segments = envelope.l4.segments
    if len(segments) < state.history or (
        _history_hash(segments[: state.history]) != state.history_hash
    ):
        return HISTORY_CHANGED, state.turns
    rest = list(segments[state.history :])
    turns = list(state.turns)
    for i, turn in enumerate(turns):
        if not rest or rest[0].role != "user" or rest[0].text != turn.query:
            return HISTORY_CHANGED, state.turns
        rest.pop(0)
        if turn.reply is not None:
            if not rest or rest[0].role != "assistant" or rest[0].text != turn.reply:
                return HISTORY_CHANGED, state.turns
            rest.pop(0)
        elif rest and rest[0].role == "assistant" and i == len(turns) - 1:
            turns[i] = attrs.evolve(turn, reply=rest.pop(0).text)
    return (HISTORY_CHANGED, state.turns) if rest else ("", tuple(turns))


def _unkeyed(turns: Sequence[DeferredTurn]) -> bool:
    """Whether ``turns`` come from a state saved without each block's key (before they
    were kept): which block holds which entry is then unknown, and nothing sheds."""
    return any(len(turn.keys) != len(turn.blocks) for turn in turns)


def _first_stale(
    turns: Sequence[DeferredTurn], forms: Mapping[str, str]
) -> tuple[int, int] | None:
    """The first block (its message's and its own index) whose entry's form in the
    library (``forms``: key -> text of the growth's entries) is not the block's: an entry
    the budget changed or took out. None: none."""
    for d, turn in enumerate(turns):
        for i, (b, k) in enumerate(zip(turn.blocks, turn.keys, strict=True)):
            if k and forms.get(k) != b:
                return d, i
    return None


def _keeps_less(
    turns: Sequence[DeferredTurn], first: tuple[int, int], grown: int, counter: TokenCounter
) -> bool:
    """Whether the growth's blocks before ``first`` hold less of it (``grown`` tokens)
    than a shed from there sends again: the batch settles instead (a growth kept deferred
    makes every later cut of history re-send all of it)."""
    kept = sum(
        counter.count(b)
        for d, turn in enumerate(turns[: first[0] + 1])
        for i, (b, k) in enumerate(zip(turn.blocks, turn.keys, strict=True))
        if k and (d < first[0] or i < first[1])
    )
    return _holds_less(kept, grown)


def _holds_less(kept: int, grown: int) -> bool:
    """Whether blocks holding ``kept`` tokens of a growth of ``grown`` hold less of it
    than a shed after them sends again (``_keeps_less``, ``shed_keys``)."""
    return kept < grown - kept


def shed_counts(
    state: BatchState, growth: Mapping[str, tuple[str, int]], counter: TokenCounter
) -> tuple[tuple[int, int], ...]:
    """Each deferred turn's message tokens as the batch would send them were its extension
    over the limit (``_shed``): from the first block whose entry's form in the library
    (``growth``: key -> text and tokens of the entries after the settled ones) is not the
    block's, those blocks at their library forms (an entry gone, none); () when that shed
    would settle instead (the request is then sent as built: it carries nothing)."""
    turns = state.turns
    if _unkeyed(turns):
        return ()
    first = _first_stale(turns, {k: text for k, (text, _) in growth.items()})
    if first is None:
        return tuple((t.turn, t.tokens) for t in turns)
    if _keeps_less(turns, first, sum(n for _, n in growth.values()), counter):
        return ()
    out = []
    for d, turn in enumerate(turns):
        tokens = turn.tokens
        if d >= first[0]:
            start = first[1] if d == first[0] else 0
            for b, k in zip(turn.blocks[start:], turn.keys[start:], strict=True):
                if k:
                    tokens += (growth[k][1] if k in growth else 0) - counter.count(b)
        out.append((turn.turn, tokens))
    return tuple(out)


def shed_keys(
    state: BatchState, growth: Mapping[str, tuple[str, int]], counter: TokenCounter
) -> tuple[str, ...]:
    """The keys of the library's growth (``growth``: key -> text and tokens of the entries
    after the settled ones) a change to which the batch sheds from when its extension is
    over the limit (``_shed``), in the order sent; a change to another settles the batch
    (the blocks before it hold less of the growth than a shed sends again:
    ``_keeps_less``). A block already stale sheds from there: after it, every key is one
    if that shed keeps the batch, none if not."""
    turns = state.turns
    if _unkeyed(turns):
        return ()
    first = _first_stale(turns, {k: text for k, (text, _) in growth.items()})
    grown = sum(n for _, n in growth.values())
    out: list[str] = []
    kept, sheds = 0, False
    for d, turn in enumerate(turns):
        for i, (b, k) in enumerate(zip(turn.blocks, turn.keys, strict=True)):
            if not k:
                continue
            if first is None or (d, i) <= first:
                sheds = not _holds_less(kept, grown)
                kept += counter.count(b)
            if sheds:
                out.append(k)
    return tuple(out)


def stale_key(state: BatchState, growth: Mapping[str, tuple[str, int]]) -> str:
    """The key of the first block of the batch's messages whose entry's form in the
    library (``growth``: key -> text and tokens of the entries after the settled ones) is
    not the block's ("": none, or a state saved without keys): a note sent whole or as a
    large preview enters the library in carry-forward form, so its block is stale from
    the next turn on, and a shed for any entry after it re-sends from there (``_shed``)."""
    turns = state.turns
    if _unkeyed(turns):
        return ""
    first = _first_stale(turns, {k: text for k, (text, _) in growth.items()})
    return "" if first is None else turns[first[0]].keys[first[1]]


def _shed(
    settled: int,
    turns: tuple[DeferredTurn, ...],
    sent: Mapping[str, str],
    envelope: Envelope,
    counter: TokenCounter,
) -> tuple[tuple[DeferredTurn, ...], dict[str, str]] | None:
    """The batch's turns with the library's growth (the entries after the first
    ``settled``) sent as ``envelope`` builds it, from the first block whose entry the budget
    changed (cut, folded into an index); before it every message stays as sent, so the
    cached prefix breaks there, not at the system message. What was ``sent`` in full is
    kept for the blocks kept. None when no block's entry changed, when the blocks before
    the first that did hold less of the growth than is sent again from it (``_keeps_less``),
    or for a state saved without keys."""
    grown = envelope.l2.segments[settled:]
    if _unkeyed(turns):
        return None
    first = _first_stale(turns, {s.key: s.text for s in grown})
    if first is None or _keeps_less(turns, first, sum(s.tokens for s in grown), counter):
        return None
    # Each grown entry with the turn whose message sent it; an index a fold made this turn
    # stands where the first entry it took stood: it goes with the entry after it.
    owner = {k: d for d, turn in enumerate(turns) for k in turn.keys if k}
    spans: dict[int, list[Segment]] = {}
    at = len(turns) - 1
    for seg in reversed(grown):
        at = owner.get(seg.key, at)
        spans.setdefault(at, []).insert(0, seg)
    out = list(turns[: first[0]])
    left = dict(sent)
    for d in range(first[0], len(turns)):
        turn = turns[d]
        cut = first[1] if d == first[0] else 0
        head = list(zip(turn.blocks[:cut], turn.keys[:cut], strict=True))
        shown = {k for _, k in head if k}
        others = [(b, "") for b, k in zip(turn.blocks[cut:-1], turn.keys[cut:-1], strict=True)
                  if not k]  # fmt: skip
        for k in turn.keys[cut:]:
            left.pop(k, None)
        # An index the library keeps unsent (no text) has no block.
        new = [s for s in spans.get(d, []) if s.key not in shown and s.text]
        left.update((s.key, s.content_hash) for s in new if s.form is Form.FULL)
        # The entries as built are measured blocks: ``_counted`` does not count them again.
        parts: list[tuple[str, str, Segment | None]] = [
            *((b, k, None) for b, k in (*head, *others)),
            *((s.text, s.key, s) for s in new),
            (turn.blocks[-1], turn.keys[-1], None),
        ]
        blocks, tokens = _counted([(b, s) for b, _, s in parts], counter)
        out.append(attrs.evolve(turn, blocks=blocks, tokens=tokens,
                                keys=tuple(k for _, k, _ in parts)))  # fmt: skip
    return tuple(out), left


def _held_decided(
    envelope: Envelope, turns: Sequence[DeferredTurn], action: DecisionAction | None = None
) -> set[str]:
    """The entries a deferred message of ``turns`` holds that the budget decided on this
    turn (``action``: by that action only)."""
    budget = envelope.report.budget
    decisions = () if budget is None else budget.decisions
    targets = {d.target for d in decisions if action is None or d.action is action}
    if not targets:
        return set()
    return {k for turn in turns for k in turn.keys if k in targets}


def _given_back(
    envelope: Envelope, settled: int, turns: Sequence[DeferredTurn], sent: Mapping[str, str]
) -> bool:
    """Whether the budget gave back this turn an entry of the library's growth (after the
    first ``settled``) that a deferred message of ``turns`` holds cut, no message having
    ``sent`` it whole: while the batch extends, that message is what the model reads."""
    held = _held_decided(envelope, turns, DecisionAction.RESTORED)
    return any(seg.key in held and seg.key not in sent for seg in envelope.l2.segments[settled:])


def batch_turn(
    state: BatchState | None,
    envelope: Envelope,
    *,
    renderer: SegmentRenderer,
    counter: TokenCounter,
    count: Callable[[Envelope], int],
    fits: Callable[[int], bool],
    settle: str = "",
    previous: Batch | None = None,
    room: Callable[[int], int] = lambda _used: 0,
    wholes: Wholes = lambda _settled, _room, _sent: (),
) -> tuple[Envelope, BatchState]:
    """This turn's envelope with the request it is sent as (``Envelope.batch``), and the
    batch state the next turn continues.

    It extends the batch (the request before it, plus that turn's reply and this turn's
    user message) unless the prefix breaks anyway or the extended request's exact count
    (``count``, the conversation's) does not ``fits``; then it settles: the envelope as
    built, with the reason. ``settle`` forces a settle with that reason. ``previous`` (the
    last request's batch, when the state continues it) lends its deferred messages and
    settled system message, so a warm turn does not join and hash them again (its
    ``user`` is not used: the conversation keeps the batch without it, so a large
    attachment's message is not held past its turn twice).

    Restore by appending: where the request leaves ``room(used)`` tokens free (beyond the
    budget's headroom), cut entries of the library the system message holds are sent whole
    again in this turn's user message (``wholes``: their whole forms that may fit, the
    conversation's; ``choose_restores``), once a batch: the model sees them in
    full and the cached prefix is not rewritten."""
    if settle or state is None:
        return _settled(envelope, counter, count, fits, settle or FIRST_TURN, room, wholes)
    known_system = None if previous is None else previous.system
    reason, turns = _extends(state, envelope, known_system)
    if reason:
        return _settled(envelope, counter, count, fits, reason, room, wholes)
    system = (
        known_system
        if known_system is not None and len(known_system) == state.system_chars
        else envelope.system_text[: state.system_chars]
    )
    rest = envelope.l4.segments[state.history :]
    library = envelope.l2.segments[: state.settled]
    lookup: dict[str, str] | None = None

    def settled(key: str) -> str | None:
        nonlocal lookup
        if lookup is None:
            lookup = {s.key: s.content_hash for s in library if s.form is not Form.REFERENCE}
        return lookup.get(key)

    users = [s for s in rest if s.role == "user"]
    known = {} if previous is None else {s.key: s for s in previous.turns}

    def extension(
        turns: tuple[DeferredTurn, ...], before: Mapping[str, str]
    ) -> tuple[Batch, list[Part], int, dict[str, str]]:
        sent = dict(before)
        parts, tokens = append_user(envelope, sent, settled, renderer, counter)
        deferred = tuple(
            _reuse(known.get(seg.key), turn)
            or _message(seg.key, seg.source_type, turn.text, turn.tokens)
            for seg, turn in zip(users, turns, strict=True)
        )
        text = BLOCK_SEP.join(t for t, _ in parts)
        user = _message(f"history:{envelope.turn}:user", "history", text, tokens)
        batch = Batch(
            state.settled,
            state.library_tokens,
            deferred,
            user,
            0,
            system_hash=state.system_hash,
            library_hash=state.library_hash,
            system=system,
        )
        return batch, parts, tokens, sent

    before: Mapping[str, str] = dict(state.sent)  # what the batch sent before this turn
    batch, parts, tokens, sent = extension(turns, before)
    used = count(attrs.evolve(envelope, batch=batch))
    owed = _given_back(envelope, state.settled, turns, sent)
    if not fits(used) or (room(used) < 0 and bool(_held_decided(envelope, turns))) or owed:
        # The library's growth as the budget fitted it: the deferred messages from the
        # first block it changed are sent as the envelope builds them now. So too where
        # the extension takes the headroom the budget left free because it holds entries
        # the budget changed this turn: they are sent as changed, not as held; and where
        # the budget gave back an entry a deferred message sent cut, if that fits: the
        # model reads the deferred message, not the library as built.
        shed = _shed(state.settled, turns, before, envelope, counter)
        if shed is not None:
            retry = extension(*shed)
            retried = count(attrs.evolve(envelope, batch=retry[0]))
            if retried < used or (owed and fits(retried)):
                turns, before = shed
                (batch, parts, tokens, sent), used = retry, retried
                owed = False  # the shed sends it as the library holds it
        if not fits(used):
            return _settled(envelope, counter, count, fits, OVER_BUDGET, room, wholes)
        if owed:  # no shed sends it: the request as built does (the budget priced that)
            return _settled(envelope, counter, count, fits, GIVEN_BACK, room, wholes)
    candidate = attrs.evolve(envelope, batch=batch)
    free = room(used)
    # The library's growth too: a deferred message sends an entry cut once the budget
    # cut it (``_shed``), and the request as sent may leave room the build did not.
    grown = len(envelope.l2.segments)
    candidates = wholes(grown, free, sent) if free > 0 else ()
    restored = choose_restores(candidates, free, counter, lambda k: _shown(envelope, k))
    if restored:
        more = dict(before)  # the message again, from what was sent before it, with restores
        parts_r, tokens_r = append_user(envelope, more, settled, renderer, counter, restored)
        text = BLOCK_SEP.join(t for t, _ in parts_r)
        user_r = _message(f"history:{envelope.turn}:user", "history", text, tokens_r)
        batch_r = attrs.evolve(batch, user=user_r, restored=tuple(restored))
        used_r = count(attrs.evolve(envelope, batch=batch_r))
        if fits(used_r):
            parts, tokens, sent, batch, used = parts_r, tokens_r, more, batch_r, used_r
            candidate = attrs.evolve(envelope, batch=batch)
    turns += (_deferred(envelope, parts, tokens, counter),)
    # ``sent`` keeps the order keys were first sent in (a refresh replaces a value in
    # place): it only grows at its end, so a store keeps it as entries written once.
    after = attrs.evolve(state, turns=turns, sent=tuple(sent.items()))
    return attrs.evolve(candidate, batch=attrs.evolve(batch, tokens=used)), after
