"""Memory as units of the budget's one solve: every earlier message findable as a passage.

History is a recent contiguous suffix (L4, cached; the budget's history ladder) plus
recalled passages. This module makes the passages and ranks them for the query; the
budget (``_budget.objective``) gives each one a ladder (absent / sent) beside the suffix's,
so how much room goes to the suffix and how much to passages is that solve's choice.

1. The passages come from the turn's history alone (``RecallMemo.passages``): single
   messages, long ones split at sentence ends, and a message that asks paired with the
   one that answers it, from every turn but the last. A restored conversation makes the
   same, so its request is the same.
2. The retriever (``Retriever``, BM25 by default) scores them for the query; a passage
   next to a match is at least ``NEIGHBOUR`` of its score (``ranked``; the budget reads
   only the passages it can use, ``relevant``). The process keeps a few BM25 indexes
   (``SHELF``): a restore extends the one made for its conversation's turn before.
3. The chosen passages go into one turn-scoped ``recalled:history`` block in
   conversation order (``objective.recalled_block``), after this turn's own items; they never enter
   L1, L2 or L4, nor a later request.
"""

from __future__ import annotations

import bisect
import functools
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._model.recall import RecallItem, Retriever
from lamina.pipeline._recall.retrievers import Bm25Retriever

__all__ = ["HISTORY_BLOCK", "PASSAGE_CHARS", "Passage", "RecallMemo"]

PASSAGE_CHARS = 1_200
"""The longest passage (about 300 tokens): a longer message is split at sentence ends,
and a message that asks is paired with the next one only if both fit."""
SEARCH_K = 512
"""The most ranked passages a turn considers."""
NEIGHBOUR = 0.5
"""A passage is at least this relevant, relative to the passage next to it: a chat stays
on a topic for a few messages, and the answer to a matched remark is often next to it."""
HISTORY_BLOCK = "history"
"""The key (after ``recalled:``) of the block that holds the recalled passages."""

_SENTENCE = re.compile(r"(?<=[.!?\n])\s+")


@attrs.frozen
class Passage:
    """A recallable passage: its item (key, first turn, text), the last turn it touches,
    its place in the conversation's passages."""

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


def _passages_of(messages: Sequence[tuple[int, str, str]], start: int) -> list[Passage]:
    """The passages of ``messages[start:]``: a long message in pieces, a message that asks
    with the next one when both fit a passage, else the message alone."""
    units: list[Passage] = []
    i = start
    while i < len(messages):
        turn, role, text = messages[i]
        key = f"history:{turn}:{role}"
        if len(text) > PASSAGE_CHARS:
            for n, piece in enumerate(_pieces(text), 1):
                units.append(Passage(RecallItem(f"{key}#{n}", turn, _line(turn, role, piece)),
                                     turn, i))  # fmt: skip
            i += 1
            continue
        if "?" in text and i + 1 < len(messages):
            t2, r2, text2 = messages[i + 1]
            if len(text) + len(text2) <= PASSAGE_CHARS:
                body = f"{_line(turn, role, text)}\n{_line(t2, r2, text2)}"
                units.append(Passage(RecallItem(f"{key}+{t2}:{r2}", turn, body), t2, i))
                i += 2
                continue
        units.append(Passage(RecallItem(key, turn, _line(turn, role, text)), turn, i))
        i += 1
    return units


@attrs.frozen
class _Whole:
    """A whole history's messages and passages, those a turn after it may recall (by key,
    in conversation order) and their places in that order."""

    messages: list[tuple[int, str, str]]
    units: list[Passage]
    recallable: dict[str, Passage]
    keys: list[str]
    at: dict[str, int]


@attrs.frozen(eq=False)
class _History:
    """A whole history as ``_all_passages`` looks it up: hashed by its length and last
    entry (not every entry, on every restore), equal by all its entries."""

    entries: tuple[HistoryEntry, ...]

    def __hash__(self) -> int:
        return hash((len(self.entries), self.entries[-1] if self.entries else None))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _History) and other.entries == self.entries


@functools.lru_cache(maxsize=64)
def _all_passages(whole: _History) -> _Whole:
    """A whole history's passages (remembered for the process: a stateless server
    restores the same conversation for each of its turns). Callers copy, never change,
    what it gives."""
    history = whole.entries
    messages = _messages(history)
    units = _passages_of(messages, 0)
    last = history[-1].turn if history else 0
    recallable = {u.item.key: u for u in units if u.last < last}
    keys = list(recallable)
    return _Whole(messages, units, recallable, keys, {key: i for i, key in enumerate(keys)})


SHELF = 16
"""How many default (BM25) indexes the process keeps for the next restore of their
conversation: a stateless server restores a conversation for each of its turns, and the
index of its recallable passages then extends the one made for the turn before (the
passages of the turns before it are the same) instead of indexing them all again."""

_shelf: list[tuple[dict[str, str], Bm25Retriever, Mapping[str, Passage]]] = []
_shelf_lock = threading.Lock()


def _shelved(passages: Mapping[str, Passage]) -> tuple[dict[str, str], Bm25Retriever] | None:
    """The largest kept index of some of ``passages`` (each item with its text), if any:
    its items (key: text, never changed) and its retriever (searched, never extended)."""
    with _shelf_lock:
        kept = sorted((e for e in _shelf if len(e[0]) <= len(passages)), key=lambda e: -len(e[0]))
    for indexed, retriever, made in kept:
        if made is passages:  # made for these (kept alive here): it holds every one
            return indexed, retriever
    if not kept:
        return None
    texts = {key: p.item.text for key, p in passages.items()}
    for indexed, retriever, _ in kept:
        if indexed.items() <= texts.items():
            return indexed, retriever
    return None


def _shelve(
    indexed: dict[str, str], retriever: Bm25Retriever, passages: Mapping[str, Passage]
) -> None:
    """Keep ``retriever`` (holding ``indexed``: all of ``passages``) for the next restore,
    the newest first."""
    with _shelf_lock:
        rest = (e for e in _shelf if e[1] is not retriever)
        _shelf[:] = [(indexed, retriever, passages), *rest][:SHELF]


class RecallMemo:
    """A conversation's passages and their index, kept between turns (mutable on purpose,
    like ``LibraryPrefix``). The passages are extended as turns come; the index is
    extended with new passages and made afresh only when an indexed one changed or left,
    so it always holds exactly the turn's recallable set (what a restored conversation
    indexes from scratch, or extends from the BM25 index the process kept for an earlier
    restore of it: ``SHELF``)."""

    def __init__(self, retriever: Callable[[], Retriever] | None = None) -> None:
        self._make: Callable[[], Retriever] = retriever or Bm25Retriever
        self._retriever: Retriever | None = None
        self._indexed: dict[str, str] = {}
        self._checked: Mapping[str, Passage] | None = None
        self._messages: list[tuple[int, str, str]] = []
        self._seen: tuple[HistoryEntry, ...] = ()
        self._units: list[Passage] = []
        self._kept: tuple[int, dict[str, Passage]] | None = None
        self._costs: dict[str, tuple[str, int]] = {}
        self._sizes: dict[str, tuple[str, int]] = {}
        self._overhead: dict[str, int] = {}
        self._order: tuple[Mapping[str, Passage], list[str], dict[str, int]] | None = None
        self._whole: _Whole | None = None
        self._shared = False
        """Whether the index is kept for other restores (``_shelve``): extended, it forks."""
        self._lock = threading.Lock()
        self.builds = 0
        """How many indexes were made (a meter: nothing dropped makes none)."""

    def _history(self, history: tuple[HistoryEntry, ...]) -> list[Passage]:
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
            units.extend(_passages_of(messages, start))
            self._whole = None
        else:
            whole = self._whole = _all_passages(_History(history))
            messages, units = whole.messages, whole.units
        self._messages, self._seen, self._units = messages, history, units
        return units

    def passages(self, history: tuple[HistoryEntry, ...]) -> dict[str, Passage]:
        """What a turn with ``history`` may recall, by key, in conversation order: the
        passages that end before its last turn."""
        with self._lock:
            kept = self._kept
            if (
                kept is not None
                and kept[0] == len(history)
                and history
                and (self._seen and self._seen[-1] is history[-1])
            ):
                return kept[1]
            last = history[-1].turn if history else 0
            units = self._history(history)
            whole = self._whole
            if whole is not None:  # made whole (a restore): its order with it
                found = whole.recallable
                self._order = (found, whole.keys, whole.at)
            else:
                found = {u.item.key: u for u in units if u.last < last}
            self._kept = (len(history), found)
            return found

    def ranked(self, passages: Mapping[str, Passage], query: str) -> list[tuple[str, float]]:
        """``passages``' relevances to ``query``, best first (ties by key): the
        retriever's scores, each at least ``NEIGHBOUR`` of its neighbours'."""
        return sorted(self.relevances(passages, query).items(), key=lambda h: (-h[1], h[0]))

    def relevances(self, passages: Mapping[str, Passage], query: str) -> dict[str, float]:
        """``ranked``'s relevances by key, in no set order (a caller that needs only the
        best sorts only those)."""
        order = self._ordered(passages)
        return _with_neighbours(self._search(passages, query, SEARCH_K), order[1], order[2])

    def relevant(
        self, passages: Mapping[str, Passage], query: str, least: float, turn: int
    ) -> dict[str, float]:
        """``relevances``' values, exact, for the passages a caller can use that offers
        those of at least ``least`` and reads those that end at ``turn`` or later
        (``since``); others may be left out. A neighbour's spread reaches ``least`` only
        from a match whose spread does, so the weak matches are read only beside the
        suffix's passages."""
        keys, at = self._ordered(passages)[1:]
        first = self._first_since(passages, turn)
        hits, matched = self._near(passages, query, least, keys[max(0, first - 1) :])
        wanted = set(range(first, len(keys)))
        for key in matched:
            score = hits[key]
            if score >= least:
                wanted.add(at[key])
            if score * NEIGHBOUR >= least:
                wanted.update((at[key] - 1, at[key] + 1))
        out: dict[str, float] = {}
        for i in wanted:
            if 0 <= i < len(keys) and (value := _spread_at(hits, keys, i)) is not None:
                out[keys[i]] = value
        return out

    def _near(
        self, passages: Mapping[str, Passage], query: str, least: float, tail: Sequence[str]
    ) -> tuple[dict[str, float], Iterable[str]]:
        """``_search``'s relevances of the passages ``relevant`` may read, and the matches
        among them (every passage of at least ``least`` is one). From the default index,
        only ``tail`` and what is near a match is scored, and a passage holding only terms
        whose largest shares add up to less than ``least`` is no match (BM25's MaxScore:
        it cannot reach it)."""
        retriever = self._indexed_for(passages)
        if type(retriever) is not Bm25Retriever or len(passages) > SEARCH_K:
            hits = self._search(passages, query, SEARCH_K)
            return hits, hits
        terms, weight = retriever.terms(query)
        # A margin far beyond the rounding of a sum of at most ``MAX_TERMS`` shares.
        bound, low = least * weight * (1.0 - 1e-9), 0.0
        read: list[dict[str, float]] = []
        for shares, top in sorted(terms, key=lambda t: t[1]):
            if low + top < bound and not read:
                low += top
            else:
                read.append(shares)
        matched: set[str] = set().union(*read)
        keys, at = self._ordered(passages)[1:]
        near = set(tail)
        for key in matched:  # a spread read beside a match's neighbour
            near.update(keys[max(0, at[key] - 2) : at[key] + 3])
        if 2 * len(near) > len(keys):  # most of them: all scored at once is quicker
            return self._search(passages, query, SEARCH_K), matched
        scores: dict[str, float] = {}
        for shares, _ in terms:  # each score adds its shares in ``scores``' order
            for key in near & shares.keys():
                known = scores.get(key)
                scores[key] = shares[key] if known is None else known + shares[key]
        return {key: score / weight for key, score in scores.items()}, matched

    def since(self, passages: Mapping[str, Passage], turn: int) -> list[str]:
        """The keys of ``passages`` (as ``passages`` gives them) that end at ``turn`` or
        later: the last of them in conversation order, where a passage never ends before
        the one before it (each starts after the message the one before ends with)."""
        return self._ordered(passages)[1][self._first_since(passages, turn) :]

    def _first_since(self, passages: Mapping[str, Passage], turn: int) -> int:
        keys = self._ordered(passages)[1]
        return bisect.bisect_left(keys, turn, key=lambda key: passages[key].last)

    def _ordered(
        self, passages: Mapping[str, Passage]
    ) -> tuple[Mapping[str, Passage], list[str], dict[str, int]]:
        """``passages``' keys in their order and each one's place (kept for the last)."""
        order = self._order
        if order is None or order[0] is not passages:
            keys = list(passages)
            order = (passages, keys, {key: i for i, key in enumerate(keys)})
            self._order = order
        return order

    def _indexed_for(self, passages: Mapping[str, Passage]) -> Retriever:
        """The retriever, holding exactly ``passages`` (extended, or made afresh)."""
        with self._lock:
            retriever = self._retriever
            if passages is not self._checked:
                stale = any(
                    (p := passages.get(key)) is None or p.item.text != text
                    for key, text in self._indexed.items()
                )
                if retriever is None or stale:
                    # A BM25 index scores by the set of items alone: one kept for some of
                    # these passages, extended by the rest, is the index made afresh.
                    kept = _shelved(passages) if self._make is Bm25Retriever else None
                    if kept is None:
                        retriever, self._indexed, self._shared = self._make(), {}, False
                    else:
                        self._indexed, retriever = kept
                        self._shared = True
                    self._retriever = retriever
                    self.builds += 1
                    made = True
                else:
                    made = False
                # Every indexed passage is one of these now: as many means the same.
                fresh = (
                    ()
                    if len(self._indexed) == len(passages)
                    else passages.keys() - self._indexed.keys()
                )
                new = [passages[key].item for key in sorted(fresh)]
                if new:
                    if self._shared:
                        assert isinstance(retriever, Bm25Retriever)
                        retriever = self._retriever = retriever.fork()
                        self._indexed, self._shared = dict(self._indexed), False
                    retriever.index(new)
                    self._indexed.update((item.key, item.text) for item in new)
                if made and not self._shared and type(retriever) is Bm25Retriever:
                    _shelve(self._indexed, retriever, passages)
                    self._shared = True
                self._checked = passages
            assert retriever is not None
            return retriever

    def _search(self, passages: Mapping[str, Passage], query: str, k: int) -> dict[str, float]:
        """The retriever's ``k`` best for ``query`` among ``passages``, by key (a key it
        gives twice keeps its lowest score)."""
        retriever = self._indexed_for(passages)
        if type(retriever) is Bm25Retriever:  # not a subclass: its ``search`` is this
            scores, weight = retriever.scores(query)
            if len(scores) <= k:  # all of them (it holds these passages, no other):
                return {key: s / weight for key, s in scores.items()}  # ``search``, unranked
        found = retriever.search(query, k)
        hits: dict[str, float] = {}
        for key, score in found:
            if key in passages:
                known = hits.get(key)
                if known is None or score < known:
                    hits[key] = score
        return hits

    def cost(self, item: RecallItem, counter: Callable[[str], int]) -> int:
        """A passage's tokens in the recalled block (its text and a line break)."""
        kept = self._costs.get(item.key)
        if kept is not None and kept[0] is item.text:
            return kept[1]
        tokens = counter(item.text) + 1
        self._costs[item.key] = (item.text, tokens)
        return tokens

    def tokens(self, key: str, text: str, counter: Callable[[str], int]) -> int:
        """``text``'s tokens (a history message the suffix no longer shows), remembered by
        ``key`` while its text is the same."""
        kept = self._sizes.get(key)
        if kept is not None and kept[0] is text:
            return kept[1]
        tokens = counter(text)
        self._sizes[key] = (text, tokens)
        return tokens

    def overhead(self, counter: str, make: Callable[[], int]) -> int:
        """The tokens of an empty recalled block and the blank line after it, counted by
        ``counter`` (``make`` counts them the first time)."""
        known = self._overhead.get(counter)
        if known is None:
            known = make()
            self._overhead[counter] = known
        return known


def _spread_at(hits: Mapping[str, float], keys: Sequence[str], i: int) -> float | None:
    """The relevance ``_with_neighbours`` gives the ``i``-th passage (None: none): its
    score, or more, the ``NEIGHBOUR`` share of a match next to it."""
    value = hits.get(keys[i])
    for j in (i - 1, i + 1):
        if 0 <= j < len(keys) and (score := hits.get(keys[j])) is not None:
            spread = score * NEIGHBOUR
            if (0.0 if value is None else value) < spread:
                value = spread
    return value


def _with_neighbours(
    hits: Mapping[str, float], keys: Sequence[str], at: Mapping[str, int]
) -> dict[str, float]:
    """``hits`` with each passage's relevance at least ``NEIGHBOUR`` of the passage
    before or after it (``keys``: the passages in conversation order, ``at`` their
    places), whatever the hits' order (the spreads are maxima)."""
    relevance = dict(hits)
    get, last = relevance.get, len(keys) - 1
    for key, score in hits.items():
        i = at.get(key)
        if i is None:
            continue
        spread = score * NEIGHBOUR
        if i > 0 and get(before := keys[i - 1], 0.0) < spread:
            relevance[before] = spread
        if i < last and get(after := keys[i + 1], 0.0) < spread:
            relevance[after] = spread
    return relevance
