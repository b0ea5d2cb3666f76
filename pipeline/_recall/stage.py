"""The recall stage: history as a recent suffix (L4, cached) plus recalled passages, the
split between them decided for this query by one objective (``units``).

Runs after the budget, which fitted the turn with history cut where it had to be.

1. What may be recalled comes from the turn alone (``RecallMemo.items``): history
   passages, which are single messages, long ones split into passages and a message that
   asks paired with the one that answers it, from every turn but the last; and cut
   library entries whose whole form the library keeps. A restored conversation indexes
   the same, so its request is the same.
2. The retriever scores them for the query; each suffix turn and each passage becomes a
   unit with tokens and value (``memory_units``).
3. ``units.choose`` picks the suffix's start (never earlier than the budget left it) and
   the passages; the start moves on only when what it frees is worth the prefix it breaks.
4. The history passages go into one turn-scoped ``recalled:history`` block in conversation
   order, each cut library entry into a block of its own, after this turn's own items;
   they never enter L1, L2 or L4. The exact count of the request decides last: while it
   is over the limit, the least relevant passage goes.

``recall_share`` (of the budget) caps what the passages take; 0 turns recall off.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from lamina.pipeline._model.envelope import BLOCK_SEP, Decision, DecisionAction, Form, Segment, View
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._model.library import LibraryEntry
from lamina.pipeline._model.recall import RecallItem, Retriever, recalled_artifact
from lamina.pipeline._recall.retrievers import Bm25Retriever
from lamina.pipeline._recall.units import (
    BREAK,
    PRICE,
    RECENCY,
    MemoryUnits,
    Passage,
    SuffixForm,
    choose,
)
from lamina.pipeline._tokens.counter import count_with_sep_from
from lamina.pipeline._turn.assemble import draft
from lamina.pipeline._turn.draft import Draft, ItemBlock
from lamina.pipeline._turn.graph import Placement, TurnGraph
from lamina.pipeline._views.views import full_view

if TYPE_CHECKING:
    from lamina.pipeline._turn.budget import Budget

__all__ = ["HISTORY_BLOCK", "PASSAGE_CHARS", "Recall", "RecallMemo", "memory_units"]

PASSAGE_CHARS = 1_200
"""The longest passage (about 300 tokens): a longer message is split at sentence ends,
and a message that asks is paired with the next one only if both fit."""
SEARCH_K = 512
"""The most ranked passages a turn considers."""
NEIGHBOUR = 0.5
"""A history passage is at least this relevant, relative to the passage next to it."""
HISTORY_BLOCK = "history"
"""The key (after ``recalled:``) of the block that holds the recalled history passages."""

_SENTENCE = re.compile(r"(?<=[.!?\n])\s+")


@attrs.frozen
class _Unit:
    """A history passage as indexed: the item, the last turn it touches, its order."""

    item: RecallItem
    last: int
    order: int


def _messages(entries: Sequence[HistoryEntry]) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []
    for entry in entries:
        if entry.user.strip():
            out.append((entry.turn, "user", entry.user))
        if entry.assistant and entry.assistant.strip():
            out.append((entry.turn, "assistant", entry.assistant))
    return out


def _line(turn: int, role: str, text: str) -> str:
    return f"{role} ({turn}): {text}"


def _pieces(text: str) -> list[str]:
    """``text`` split at sentence ends into pieces of at most ``PASSAGE_CHARS`` (a
    sentence longer than that is cut at the limit)."""
    pieces: list[str] = []
    current = ""
    for sentence in _SENTENCE.split(text):
        while len(sentence) > PASSAGE_CHARS:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:PASSAGE_CHARS])
            sentence = sentence[PASSAGE_CHARS:]
        if current and len(current) + 1 + len(sentence) > PASSAGE_CHARS:
            pieces.append(current)
            current = ""
        current = f"{current} {sentence}" if current else sentence
    if current:
        pieces.append(current)
    return pieces


def _history_units(messages: Sequence[tuple[int, str, str]], start: int) -> list[_Unit]:
    """The passages of ``messages[start:]``: a long message in pieces, a message that asks
    with the next one when both fit a passage, else the message alone."""
    units: list[_Unit] = []
    i = start
    while i < len(messages):
        turn, role, text = messages[i]
        key = f"history:{turn}:{role}"
        if len(text) > PASSAGE_CHARS:
            for n, piece in enumerate(_pieces(text), 1):
                item = RecallItem(f"{key}#{n}", turn, _line(turn, role, piece), role)
                units.append(_Unit(item, turn, i))
            i += 1
            continue
        if "?" in text and i + 1 < len(messages):
            t2, r2, text2 = messages[i + 1]
            if len(text) + len(text2) <= PASSAGE_CHARS:
                body = f"{_line(turn, role, text)}\n{_line(t2, r2, text2)}"
                item = RecallItem(f"{key}+{t2}:{r2}", turn, body, role)
                units.append(_Unit(item, t2, i))
                i += 2
                continue
        units.append(_Unit(RecallItem(key, turn, _line(turn, role, text), role), turn, i))
        i += 1
    return units


@functools.lru_cache(maxsize=64)
def _passages(
    history: tuple[HistoryEntry, ...],
) -> tuple[list[tuple[int, str, str]], list[_Unit]]:
    """A whole history's messages and passages (remembered for the process: a stateless
    server restores the same conversation for each of its turns). Callers copy, never
    change, what it gives."""
    messages = _messages(history)
    return messages, _history_units(messages, 0)


class RecallMemo:
    """A conversation's recall index, kept between turns (mutable on purpose, like
    ``LibraryPrefix``). The history's passages are extended as turns come; the index is
    extended with new items and made afresh only when an indexed item changed or left,
    so it always holds exactly the turn's recallable set (what a restored conversation
    indexes from scratch). It also remembers each item's block and count."""

    def __init__(self, retriever: Callable[[], Retriever] | None = None) -> None:
        self._make: Callable[[], Retriever] = retriever or Bm25Retriever
        self._retriever: Retriever | None = None
        self._indexed: dict[str, str] = {}
        self._checked: Mapping[str, RecallItem] | None = None
        self._messages: list[tuple[int, str, str]] = []
        self._seen: tuple[HistoryEntry, ...] = ()
        self._units: list[_Unit] = []
        self._items: tuple[int, dict[str, RecallItem], dict[str, _Unit]] | None = None
        self._blocks: dict[str, tuple[str, ItemBlock]] = {}
        self._costs: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self.builds = 0
        """How many indexes were made (a meter: off, or nothing dropped, makes none)."""

    def search(
        self, items: Mapping[str, RecallItem], query: str, k: int
    ) -> list[tuple[str, float]]:
        """The best ``k`` of ``items`` for ``query`` as (key, score), best first, ties by key."""
        with self._lock:
            retriever = self._retriever
            if items is not self._checked:
                stale = any(
                    (item := items.get(key)) is None or item.text != text
                    for key, text in self._indexed.items()
                )
                if retriever is None or stale:
                    retriever = self._make()
                    self._retriever, self._indexed = retriever, {}
                    self.builds += 1
                new = [items[key] for key in sorted(items) if key not in self._indexed]
                if new:
                    retriever.index(new)
                    self._indexed.update((item.key, item.text) for item in new)
                self._checked = items
            assert retriever is not None
            found = retriever.search(query, k)
        return sorted(
            ((key, score) for key, score in found if key in items), key=lambda h: (-h[1], h[0])
        )

    def _history(self, history: tuple[HistoryEntry, ...]) -> list[_Unit]:
        """The passages of ``history``, extending those of the history seen last."""
        seen = self._seen
        if seen and len(history) >= len(seen) and history[len(seen) - 1] is seen[-1]:
            # Passages touching the last seen turn may pair with what follows: made again.
            last = seen[-1].turn
            start = min(
                (u.order for u in self._units if u.last >= last), default=len(self._messages)
            )
            messages = self._messages + _messages(history[len(seen) :])
            units = [u for u in self._units if u.order < start]
            units.extend(_history_units(messages, start))
        else:
            messages, units = _passages(history)
        self._messages, self._seen, self._units = messages, history, units
        return units

    def items(self, turn: TurnGraph) -> tuple[dict[str, RecallItem], dict[str, _Unit]]:
        """What ``turn`` may recall, by key: the history passages that end before its last
        history turn (in conversation order), then cut library entries whose whole form
        is kept (folded ones included; not attached again this turn); and the history
        passages' units."""
        history = turn.history
        with self._lock:
            kept = self._items
            if kept is not None and kept[0] == len(history) and history and (
                self._seen and self._seen[-1] is history[-1]
            ):
                passages, units = kept[1], kept[2]
            else:
                last = history[-1].turn if history else 0
                units = {
                    u.item.key: u for u in self._history(history) if u.last < last
                }
                passages = {key: u.item for key, u in units.items()}
                self._items = (len(history), passages, units)
        library = _library_items(turn)
        if not library:
            return passages, units
        return {**passages, **library}, units

    def cost(self, item: RecallItem, counter: Callable[[str], int]) -> int:
        """A history passage's tokens in the recalled block (its text and a line break)."""
        kept = self._costs.get(item.key)
        if kept is not None and kept[0] is item.text:
            return kept[1]
        tokens = counter(item.text) + 1
        self._costs[item.key] = (item.text, tokens)
        return tokens

    def block(self, item: RecallItem, turn: TurnGraph) -> ItemBlock:
        """``item``'s recalled block as a draft measures it (made once per item text), so
        adding it to a turn renders and counts nothing again."""
        kept = self._blocks.get(item.key)  # a dict read is atomic; writes take the lock
        if kept is not None and kept[0] is item.text:
            return kept[1]
        block = _measured_block(item, turn)
        with self._lock:
            self._blocks[item.key] = (item.text, block)
        return block


def _history_item(text: str) -> RecallItem:
    """The item of the one block that holds the recalled history passages."""
    return RecallItem(HISTORY_BLOCK, 0, text, "earlier messages")


def _measured_block(item: RecallItem, turn: TurnGraph) -> ItemBlock:
    """``item``'s recalled block, rendered and counted (with the blank line after it)."""
    artifact = recalled_artifact(item)
    view = full_view(artifact)
    counter = turn.ctx.counter
    text = turn.ctx.renderer.render(view)
    tokens = counter.count(text)
    with_sep = count_with_sep_from(text, tokens, BLOCK_SEP, counter.count)
    return ItemBlock(
        Placement(artifact.key), artifact, Segment.of_view(view, text, tokens), with_sep
    )


def _cost(block: ItemBlock) -> int:
    """A block's tokens with the blank line after it (an upper bound when not known)."""
    return block.with_sep if block.with_sep is not None else block.segment.tokens + 2


def _library_items(turn: TurnGraph) -> dict[str, RecallItem]:
    out: dict[str, RecallItem] = {}
    present: set[str] | None = None
    # A library index folds the stubs it lists: they are cut entries too.
    entries = [e for lib in turn.library.entries for e in (lib, *lib.folded)]
    for lib in entries:
        whole = _whole(lib)
        if whole is None or not whole.body.strip():
            continue
        if present is None:
            present = {item.key for item in turn.items}
        if lib.key not in present and lib.key not in out:
            out[lib.key] = RecallItem(lib.key, lib.turn, whole.body, whole.title)
    return out


def _whole(entry: LibraryEntry) -> View | None:
    """The fuller view a cut library entry keeps (None while it is in that form)."""
    whole = entry.whole
    if whole is None or whole.form is Form.REFERENCE or entry.form is Form.FULL:
        return None
    return whole


def _with_neighbours(
    hits: list[tuple[str, float]], history: Mapping[str, _Unit]
) -> list[tuple[str, float]]:
    """``hits`` with each history passage's relevance at least ``NEIGHBOUR`` of the
    passage before or after it (``history`` is in conversation order): a chat stays on a
    topic for a few messages, and the answer to a matched remark is often the one next to
    it. Best first, ties by key."""
    relevance = dict(hits)
    keys = list(history)
    at = {key: i for i, key in enumerate(keys)}
    for key, score in hits:
        i = at.get(key)
        if i is None:
            continue
        spread = score * NEIGHBOUR
        if spread < PRICE:
            break  # best first: no later hit lifts a neighbour to its price either
        for j in (i - 1, i + 1):
            if 0 <= j < len(keys) and relevance.get(keys[j], 0.0) < spread:
                relevance[keys[j]] = spread
    return sorted(relevance.items(), key=lambda h: (-h[1], h[0]))


@attrs.frozen
class _Measured:
    """A turn measured for memory: its units, and what the choice is applied with."""

    units: MemoryUnits
    items: Mapping[str, RecallItem]
    history: Mapping[str, _Unit]
    used: int
    measured: Draft
    overhead: int


def _turn_tokens(measured: Draft, per_message: int) -> dict[int, int]:
    """Each shown history turn's tokens in the request (its messages, framed)."""
    sizes: dict[int, int] = {}
    for seg in measured.l4.segments:
        number = int(seg.key.split(":")[1])
        sizes[number] = sizes.get(number, 0) + seg.tokens + per_message
    return sizes


def memory_units(turn: TurnGraph) -> MemoryUnits | None:
    """``turn``'s memory as units with tokens and value (the objective of ``units``), or
    None when recall is off or there is nothing to recall. A budget solver may take
    these beside its other ladders; the recall stage applies ``units.choose`` to them."""
    found = _measure(turn)
    return None if found is None else found.units


def _measure(turn: TurnGraph) -> _Measured | None:
    """``turn`` measured for memory (``memory_units``), with what applying a choice needs."""
    budget = turn.ctx.budget
    memo = turn.ctx.recall
    if budget is None or memo is None or budget.recall_share <= 0 or not turn.history:
        return None
    items, history = memo.items(turn)
    if not items:
        return None
    counter = turn.ctx.counter
    measured = turn.measured if turn.measured is not None else draft(turn)
    report = turn.budget_report
    used = report.used if report is not None else budget.used(measured, counter)
    hits = _with_neighbours(memo.search(items, turn.query, SEARCH_K), history)
    sizes = _turn_tokens(measured, budget.per_message_tokens)
    last = turn.history[-1].turn
    start = turn.history_view.start
    shown = [t for t in sorted(sizes) if start <= t < last]
    # A suffix turn's relevance: its best passage's.
    by_turn: dict[int, float] = {}
    for key, score in hits:
        unit = history.get(key)
        if unit is not None and unit.last >= start:
            by_turn[unit.item.turn] = max(by_turn.get(unit.item.turn, 0.0), score)
            by_turn[unit.last] = max(by_turn.get(unit.last, 0.0), score)
    free = budget.limit - budget.effective(used)
    room = free + sum(sizes[t] for t in shown)
    # The suffix's forms, fewest tokens first: from the last turn alone to the suffix as
    # the turn found it (no break); any other start breaks the prefix from L4 on.
    free_break = _history_cut(turn)
    kept_last = sizes.get(last, 0)

    def form(begins: int, tokens: int, value: float) -> SuffixForm:
        moved = begins != start and not free_break
        return SuffixForm(begins, tokens, value - (BREAK * (tokens + kept_last) if moved else 0))

    forms = [form(start if not shown else last, 0, 0.0)]
    tokens, value = 0, 0.0
    for t in reversed(shown):
        tokens += sizes[t]
        value += (RECENCY + by_turn.get(t, 0.0)) * sizes[t]
        forms.append(form(start if t == shown[0] else t, tokens, value))
    overhead = _history_overhead(turn)
    passages: list[Passage] = []
    spent = 0
    for key, score in hits:
        if score < PRICE or spent > room:
            break
        item = items[key]
        unit = history.get(key)
        if unit is None:
            cost = _cost(memo.block(item, turn))
            passages.append(Passage(key, 0, cost, score))  # not history: never in L4
        else:
            cost = memo.cost(item, counter.count)
            passages.append(Passage(key, unit.last, cost, score))
        spent += cost
    cap = math.floor(budget.limit * budget.recall_share)
    slack = budget.headroom_tokens
    units = MemoryUnits(
        max(0, room - overhead), tuple(forms), tuple(passages), max(0, cap - overhead), slack
    )
    return _Measured(units, items, history, used, measured, overhead)


def _history_overhead(turn: TurnGraph) -> int:
    """The tokens of an empty history block and the blank line after it."""
    return _cost(_measured_block(_history_item(""), turn))


@attrs.frozen
class Recall:
    """The recall stage (``recall_share`` of the budget > 0; otherwise it does nothing)."""

    name: str = "recall"
    after: tuple[str, ...] = ("budget",)
    before: tuple[str, ...] = ("promote",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        found = _measure(turn)
        if found is None:
            return turn
        budget = turn.ctx.budget
        memo = turn.ctx.recall
        assert budget is not None and memo is not None
        choice = choose(found.units)
        chosen = list(choice.passages)
        counter = turn.ctx.counter
        measured, used = found.measured, found.used
        decisions: list[Decision] = []
        start = turn.history_view.start
        if choice.start > start:
            freed = sum(
                tokens
                for number, tokens in _turn_tokens(measured, budget.per_message_tokens).items()
                if number < choice.start
            )
            view = attrs.evolve(turn.history_view, start=choice.start)
            first = start
            target = (
                f"history:{first}" if choice.start - 1 == first
                else f"history:{first}-{choice.start - 1}"
            )
            decisions.append(
                Decision(
                    "recall",
                    target,
                    "text",
                    "dropped",
                    "oldest history turns dropped for recalled passages worth more to "
                    "this query (they stay findable)",
                    freed,
                    layer="L4",
                    action=DecisionAction.HISTORY_CUT,
                )
            )
            turn = attrs.evolve(turn, history_view=view)
            measured = draft(turn, measured)
            used = budget.used(measured, counter)
        cap = math.floor(budget.limit * budget.recall_share)
        while chosen:
            out, after, recalled = _with_recalled(turn, measured, memo, chosen, found)
            now = budget.used(after, counter)
            if budget.effective(now) <= budget.limit and recalled <= cap:
                made = [_recalled_decision(self.name, p.key) for p in chosen]
                return _reported(out, after, now, budget, [*decisions, *made])
            # The exact count says no: the least relevant passages go, about the excess.
            excess = max(budget.effective(now) - budget.limit, recalled - cap)
            chosen = _without_least(chosen, excess)
        if decisions:
            return _reported(turn, measured, used, budget, decisions)
        return turn


def _without_least(chosen: list[Passage], excess: int) -> list[Passage]:
    """``chosen`` less its least relevant passages holding at least ``excess`` tokens."""
    kept = list(chosen)
    dropped = 0
    while kept and dropped < excess:
        dropped += kept.pop().tokens
    return kept


@functools.lru_cache(maxsize=4096)
def _recalled_decision(stage: str, key: str) -> Decision:
    """The decision that recalls ``key`` (a value: made once per key)."""
    return Decision(
        stage,
        f"recalled:{key}",
        "dropped",
        "full",
        "dropped earlier; the query matches it, so it is sent in this turn",
        layer="L3",
        action=DecisionAction.RECALLED,
    )


def _with_recalled(
    turn: TurnGraph,
    measured: Draft,
    memo: RecallMemo,
    chosen: Sequence[Passage],
    found: _Measured,
) -> tuple[TurnGraph, Draft, int]:
    """``turn`` with the ``chosen`` passages after its own items: the history ones in one
    block in conversation order, then each library entry's block; its draft, and the
    recalled blocks' tokens."""
    history = sorted(
        (found.history[p.key] for p in chosen if p.key in found.history), key=lambda u: u.order
    )
    blocks: list[ItemBlock] = []
    if history:
        text = "\n".join(u.item.text for u in history)
        blocks.append(_measured_block(_history_item(text), turn))
    library = sorted(
        (found.items[p.key] for p in chosen if p.key not in found.history),
        key=lambda i: (i.turn, i.key),
    )
    blocks.extend(memo.block(item, turn) for item in library)
    graph = turn.graph.copy()
    for block in blocks:
        graph.add_node(block.artifact.key, kind="artifact", artifact=block.artifact)
    placements = tuple(block.placement for block in blocks)
    out = attrs.evolve(turn, graph=graph, items=(*turn.items, *placements))
    known = attrs.evolve(measured, items=(*measured.items, *blocks))
    return out, draft(out, known), sum(block.segment.tokens for block in blocks)


def _history_cut(turn: TurnGraph) -> bool:
    """Whether the budget dropped history turns in this turn (the prefix breaks anyway)."""
    return any(d.action is DecisionAction.HISTORY_CUT for d in turn.decisions)


def _reported(
    turn: TurnGraph, measured: Draft, used: int, budget: Budget, decisions: list[Decision]
) -> TurnGraph:
    """``turn`` with its draft, the budget report's use and the recall decisions."""
    report = turn.budget_report
    if report is not None:
        report = attrs.evolve(
            report,
            used=used,
            effective=budget.effective(used),
            after=measured.layer_tokens(),
            decisions=(*report.decisions, *decisions),
        )
    out = attrs.evolve(turn, measured=measured, budget_report=report)
    return out.decide(*decisions)
