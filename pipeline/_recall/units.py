"""Memory as units with tokens and value: the recent suffix of history (L4, cached) as
one ladder of forms, and every recallable passage as a unit of its own.

This module holds the data and the one objective; ``stage`` measures a turn into it and
applies the choice. A budget solver can take the same units (``memory_units``) and pick
among them beside its other ladders.

The objective, per turn: maximize the value of what memory sends, within the room it has
(the request's free room plus what the shown history takes beyond its last turn).

- A recalled passage is worth ``relevance`` per token (its retriever score, in [0, 1]:
  the share of the query's weight it matches), and only if that is at least
  ``PRICE``, what a token sent outside the cached prefix costs.
- A suffix turn is worth ``RECENCY + relevance`` per token: the recent turns carry the
  thread of the chat whatever the query.
- Moving the suffix's start costs ``BREAK`` per token that it leaves uncached (the kept
  suffix and the last turn), unless the budget moved it this turn already.

One greedy keeps it: the suffix ladder's forms (each start) are reduced to their upper
convex hull, whose steps are merged with the passages best value per token first, and
taken while they fit; the suffix then takes the most valuable of all its forms that the
room left allows (a hull step too big to fit may hide one), and passages inside the
chosen suffix are dropped, the room they held filled by the next best.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import attrs

__all__ = [
    "BREAK",
    "PRICE",
    "RECENCY",
    "MemoryChoice",
    "MemoryUnits",
    "Passage",
    "SuffixForm",
    "choose",
]

RECENCY = 0.2
"""Value per token of a turn in the recent suffix beyond its relevance to the query."""
PRICE = 0.3
"""The least relevance a passage must have to be sent: the value an uncached token costs."""
BREAK = 0.1
"""Value lost per token that a moved suffix start leaves out of the cached prefix."""


@attrs.frozen
class Passage:
    """A recallable unit: its key, the turn it starts in, its tokens and relevance."""

    key: str
    turn: int
    tokens: int
    relevance: float

    @property
    def value(self) -> float:
        return self.relevance * self.tokens


@attrs.frozen
class SuffixForm:
    """L4 shown from turn ``start`` on: the tokens of the turns before the last one
    (which is always shown) and their value, the price of the break included."""

    start: int
    tokens: int
    value: float


@attrs.frozen
class MemoryUnits:
    """A turn's memory as a solver takes it: the suffix ladder (fewest tokens first; its
    last form is the suffix as the turn found it) and the passages, best first; ``room``
    is what they may take together."""

    room: int
    suffix: tuple[SuffixForm, ...]
    passages: tuple[Passage, ...]
    cap: int
    """The most tokens the passages may take together (the budget's ``recall_share``)."""
    slack: int = 0
    """What the next turns add to history: a start that moves leaves it free, so the
    prefix it breaks is not broken again at once."""


@attrs.frozen
class MemoryChoice:
    """What the greedy took: the suffix's start and the passages, best first."""

    start: int
    passages: tuple[Passage, ...]
    tokens: int
    value: float


def _hull(forms: Sequence[SuffixForm]) -> list[SuffixForm]:
    """The upper convex hull of (tokens, value) from the first form (fewest tokens) on:
    each step's value per token is at most the one before it."""
    hull: list[SuffixForm] = []
    for form in forms:
        if hull and form.value <= hull[-1].value:
            continue  # more tokens for no more value
        while len(hull) >= 2 and _slope(hull[-2], hull[-1]) <= _slope(hull[-1], form):
            hull.pop()
        hull.append(form)
    return hull


def _slope(a: SuffixForm, b: SuffixForm) -> float:
    return (b.value - a.value) / max(1, b.tokens - a.tokens)


def _steps(
    hull: Sequence[SuffixForm], passages: Sequence[Passage]
) -> Iterator[tuple[float, int, int, SuffixForm | Passage]]:
    """Every increment as (-value per token, order, tokens, what): the hull's steps and
    the passages, best first once sorted."""
    for i, (a, b) in enumerate(itertools.pairwise(hull)):
        yield (-_slope(a, b), i, b.tokens - a.tokens, b)
    for j, passage in enumerate(passages):
        if passage.relevance >= PRICE:
            yield (-passage.relevance, len(hull) + j, passage.tokens, passage)


def choose(units: MemoryUnits) -> MemoryChoice:
    """The objective's choice for ``units`` (the greedy in the module's docstring)."""
    hull = _hull(units.suffix)
    room, cap = units.room, units.cap
    suffix = hull[0]
    room -= suffix.tokens
    taken: list[Passage] = []
    stopped = False
    for _, _, tokens, what in sorted(_steps(hull, units.passages), key=lambda s: s[:2]):
        if isinstance(what, SuffixForm):
            if stopped or tokens > room:
                stopped = True  # the ladder's later steps need this one
                continue
            room -= tokens
            suffix = what
        elif tokens <= min(room, cap):
            room -= tokens
            cap -= tokens
            taken.append(what)
    # A step of the hull that did not fit may hide a form between its ends that does:
    # the suffix takes the most valuable form the room left allows.
    fits = [f for f in units.suffix if f.tokens <= suffix.tokens + room]
    best = max(fits, key=lambda f: (f.value, -f.tokens))
    if best.value > suffix.value:
        room += suffix.tokens - best.tokens
        suffix = best
    if suffix is not units.suffix[-1] and units.slack:
        # A moved start breaks the prefix: it leaves the slack free for the next turns.
        left = [f for f in units.suffix if f.tokens <= suffix.tokens + room - units.slack]
        best = max(left, key=lambda f: (f.value, -f.tokens), default=units.suffix[0])
        room += suffix.tokens - best.tokens
        suffix = best
    kept = [p for p in taken if p.turn < suffix.start]
    if len(kept) < len(taken):  # passages the suffix holds: their room goes to the next best
        freed = sum(p.tokens for p in taken) - sum(p.tokens for p in kept)
        room, cap = room + freed, cap + freed
        chosen = {p.key for p in kept}
        for passage in units.passages:
            if passage.key in chosen or passage.turn >= suffix.start or passage.relevance < PRICE:
                continue
            if passage.tokens <= min(room, cap):
                room -= passage.tokens
                cap -= passage.tokens
                kept.append(passage)
    tokens = suffix.tokens + sum(p.tokens for p in kept)
    value = suffix.value + sum(p.value for p in kept)
    return MemoryChoice(suffix.start, tuple(kept), tokens, value)
