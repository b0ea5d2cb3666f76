"""The recall stage: bring back, into this turn's user message, what the budget dropped
and the query asks about.

Runs after the budget. What it may recall is derived from the turn alone: history
messages before L4's cut point and cut library entries whose whole form the library
keeps. A ``RecallMemo`` (per conversation) keeps them indexed; a restored conversation
builds the same index from its stored history and library, so the request is the same.
The recalled blocks are turn-scoped (``recalled:<key>``), placed after this turn's own
items, in conversation order; they never enter L1, L2 or L4, so the cached prefix is the
one the budget left. Their room is the budget's ``recall_share`` of the limit: when less
than ``floor`` of it is free, or when the budget cut history this turn anyway, the
history cut point moves on until all of it is (hysteresis: the prefix breaks once per
that many turns, not every few). Only hits
scoring at least ``RELEVANCE`` of the best are recalled, best first while they fit.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Mapping, Sequence

import attrs

from lamina.pipeline._budget.fit import Budget
from lamina.pipeline._model.envelope import BLOCK_SEP, Decision, DecisionAction, Form, Segment, View
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._model.library import LibraryEntry
from lamina.pipeline._model.recall import RecallItem, Retriever, recalled_artifact
from lamina.pipeline._recall.retrievers import Bm25Retriever
from lamina.pipeline._tokens.counter import count_with_sep_from
from lamina.pipeline._turn.assemble import draft, visible_history
from lamina.pipeline._turn.draft import Draft, ItemBlock
from lamina.pipeline._turn.graph import Placement, TurnGraph
from lamina.pipeline._views.views import full_view

__all__ = ["RECALL_FLOOR", "Recall", "RecallMemo"]

RECALL_FLOOR = 0.1
"""Below this share of its room free, recall moves the history cut point on."""
SEARCH_K = 64
"""The most ranked items a turn considers."""
MIN_BLOCK = 40
"""About the fewest tokens a recalled block takes (its tags and a few words): a share of
``s`` tokens considers at most ``s // MIN_BLOCK`` items."""
RELEVANCE = 0.25
"""Items scoring under this share of the best hit are not recalled: they match the query
by a common word only, and would take room from the cached history for nothing."""


class RecallMemo:
    """A conversation's recall index, kept between turns (mutable on purpose, like
    ``LibraryPrefix``). No index exists until a turn recalls; it is extended with what
    the budget drops next, and made afresh when an indexed item is no longer dropped or
    has changed, so it always holds exactly the turn's recallable set (what a restored
    conversation indexes from scratch). It also remembers each item's block and count."""

    def __init__(self, retriever: Callable[[], Retriever] | None = None) -> None:
        self._make: Callable[[], Retriever] = retriever or Bm25Retriever
        self._retriever: Retriever | None = None
        self._indexed: dict[str, str] = {}
        self._checked: Mapping[str, RecallItem] | None = None
        self._history: tuple[int, object, dict[str, RecallItem]] | None = None
        self._blocks: dict[str, tuple[str, ItemBlock]] = {}
        self.costs: dict[str, tuple[str, int]] = {}
        """Each measured item's block cost by key, with the text it was measured from."""
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

    def items(self, turn: TurnGraph) -> dict[str, RecallItem]:
        """What ``turn`` may recall, by key in conversation order: history messages before
        L4's cut point, then cut library entries whose whole form is kept (folded ones
        included; not attached again this turn). The history part is remembered while the
        cut point and the entries before it are the same."""
        start = turn.history_view.start
        history = turn.history
        # Entries are numbered from 1 in order, so the last one dropped is found directly.
        last = history[start - 2] if 2 <= start <= len(history) + 1 else None
        if last is not None and last.turn != start - 1:
            last = None
        fresh: list[RecallItem] = []
        with self._lock:
            kept = self._history
            if kept is not None and kept[0] == start and kept[1] is last:
                dropped = kept[2]
            else:
                dropped = _history_items([e for e in history if e.turn < start])
                self._history = (start, last, dropped)
                if kept is not None:
                    fresh = [item for key, item in dropped.items() if key not in self.costs]
        # Messages dropped by a moving cut point are measured in the turn that drops them
        # (the prefix breaks there anyway), so a turn that recalls one finds its block
        # ready; a first index (a restored conversation) measures only what it recalls.
        for item in fresh:
            self.block(item, turn)
        library = _library_items(turn)
        if not library:
            return dropped
        return {**dropped, **library}

    def block(self, item: RecallItem, turn: TurnGraph) -> ItemBlock:
        """``item``'s recalled block as a draft measures it (made once per item text), so
        adding it to a turn renders and counts nothing again."""
        kept = self._blocks.get(item.key)  # a dict read is atomic; writes take the lock
        if kept is not None and kept[0] is item.text:
            return kept[1]
        artifact = recalled_artifact(item)
        view = full_view(artifact)
        counter = turn.ctx.counter
        text = turn.ctx.renderer.render(view)
        tokens = counter.count(text)
        with_sep = count_with_sep_from(text, tokens, BLOCK_SEP, counter.count)
        block = ItemBlock(
            Placement(artifact.key), artifact, Segment.of_view(view, text, tokens), with_sep
        )
        with self._lock:
            self._blocks[item.key] = (item.text, block)
            self.costs[item.key] = (item.text, _cost(block))
        return block


def _cost(block: ItemBlock) -> int:
    """A block's tokens with the blank line after it (an upper bound when not known)."""
    return block.with_sep if block.with_sep is not None else block.segment.tokens + 2


def _history_items(entries: Sequence[HistoryEntry]) -> dict[str, RecallItem]:
    out: dict[str, RecallItem] = {}
    for entry in entries:
        if entry.user.strip():
            key = f"history:{entry.turn}:user"
            out[key] = RecallItem(key, entry.turn, entry.user, "user")
        if entry.assistant and entry.assistant.strip():
            key = f"history:{entry.turn}:assistant"
            out[key] = RecallItem(key, entry.turn, entry.assistant, "assistant")
    return out


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


@attrs.frozen
class Recall:
    """The recall stage (``recall_share`` of the budget > 0; otherwise it does nothing)."""

    name: str = "recall"
    after: tuple[str, ...] = ("budget",)
    before: tuple[str, ...] = ("promote",)
    floor: float = RECALL_FLOOR

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        budget = turn.ctx.budget
        memo = turn.ctx.recall
        if budget is None or memo is None or budget.recall_share <= 0:
            return turn
        items = memo.items(turn)
        if not items:
            return turn
        share = math.floor(budget.limit * budget.recall_share)
        k = min(SEARCH_K, max(1, share // MIN_BLOCK))
        hits = _relevant(memo.search(items, turn.query, k))
        if not hits:
            return turn
        counter = turn.ctx.counter
        measured = turn.measured if turn.measured is not None else draft(turn)
        report = turn.budget_report
        used = report.used if report is not None else budget.used(measured, counter)
        decisions: list[Decision] = []
        free = budget.limit - budget.effective(used)
        # The history cut moves for the whole share when the room runs low, or when the
        # budget moved it this turn (the cached prefix breaks there anyway).
        if free < share and (free < share * self.floor or _history_cut(turn)):
            moved = _make_room(turn, measured, share - free, budget)
            if moved is not None:
                turn, decision = moved
                decisions.append(decision)
                measured = draft(turn, measured)
                used = budget.used(measured, counter)
                free = budget.limit - budget.effective(used)
                items = memo.items(turn)
                hits = _relevant(memo.search(items, turn.query, k))
        room = min(share, free)
        chosen = _choose(turn, memo, items, hits, room)
        while chosen:
            out, after = _with_recalled(turn, measured, memo, chosen, items)
            now = budget.used(after, counter)
            if now - used <= room and budget.effective(now) <= budget.limit:
                made = [_recalled_decision(self.name, key) for key in chosen]
                return _reported(out, after, now, budget, [*decisions, *made])
            chosen = chosen[:-1]  # the exact count says no: leave out the lowest ranked
        if decisions:
            return _reported(turn, measured, used, budget, decisions)
        return turn


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


def _relevant(hits: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The hits scoring at least ``RELEVANCE`` of the best one (ranked the same)."""
    if not hits:
        return hits
    least = hits[0][1] * RELEVANCE
    return [hit for hit in hits if hit[1] >= least]


def _choose(
    turn: TurnGraph,
    memo: RecallMemo,
    items: Mapping[str, RecallItem],
    hits: Sequence[tuple[str, float]],
    room: int,
) -> list[str]:
    """The best-ranked items whose blocks (and a blank line each) fit ``room``."""
    chosen: list[str] = []
    spent = 0
    known = memo.costs
    for key, _ in hits:
        item = items[key]
        kept = known.get(key)
        cost = kept[1] if kept is not None and kept[0] is item.text else None
        if cost is None:
            cost = _cost(memo.block(item, turn))
        if spent + cost <= room:
            chosen.append(key)
            spent += cost
            if room - spent < MIN_BLOCK:
                break
    return chosen


def _conversation_order(item: RecallItem) -> tuple[int, int, str]:
    """History by turn, a turn's user message before its reply, then library entries."""
    if item.key.startswith("history:"):
        return (item.turn, 0 if item.key.endswith(":user") else 1, item.key)
    return (item.turn, 2, item.key)


def _with_recalled(
    turn: TurnGraph,
    measured: Draft,
    memo: RecallMemo,
    chosen: Sequence[str],
    items: Mapping[str, RecallItem],
) -> tuple[TurnGraph, Draft]:
    """``turn`` with the ``chosen`` items as recalled blocks after its own, in conversation
    order (history by turn and role, then library entries), and its draft (the blocks
    come measured from the memo)."""
    graph = turn.graph.copy()
    blocks: list[ItemBlock] = []
    for key in sorted(chosen, key=lambda k: _conversation_order(items[k])):
        block = memo.block(items[key], turn)
        graph.add_node(block.artifact.key, kind="artifact", artifact=block.artifact)
        blocks.append(block)
    placements = tuple(block.placement for block in blocks)
    out = attrs.evolve(turn, graph=graph, items=(*turn.items, *placements))
    known = attrs.evolve(measured, items=(*measured.items, *blocks))
    return out, draft(out, known)


def _history_cut(turn: TurnGraph) -> bool:
    """Whether the budget dropped history turns in this turn."""
    return any(d.action is DecisionAction.HISTORY_CUT for d in turn.decisions)


def _make_room(
    turn: TurnGraph, measured: Draft, need: int, budget: Budget
) -> tuple[TurnGraph, Decision] | None:
    """Move the history cut point past the oldest shown turns until about ``need`` tokens
    are freed (never past the last turn); None if nothing can go."""
    shown = visible_history(turn)
    if len(shown) <= 1:
        return None
    sizes: dict[int, int] = {}
    for seg in measured.l4.segments:
        number = int(seg.key.split(":")[1])
        sizes[number] = sizes.get(number, 0) + seg.tokens + budget.per_message_tokens + 2
    first = shown[0][0].turn
    freed = 0
    start = first
    for entry, _ in shown[:-1]:
        if freed >= need:
            break
        freed += sizes.get(entry.turn, 0)
        start = entry.turn + 1
    if start == first:
        return None
    view = attrs.evolve(turn.history_view, start=start)
    target = f"history:{first}" if start - 1 == first else f"history:{first}-{start - 1}"
    decision = Decision(
        "recall",
        target,
        "text",
        "dropped",
        "oldest history turns dropped to make the recall share's room (they stay findable)",
        freed,
        layer="L4",
        action=DecisionAction.HISTORY_CUT,
    )
    return attrs.evolve(turn, history_view=view), decision


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
