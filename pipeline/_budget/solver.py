"""The budget's one objective and its one solver, over ladders of forms.

Every unit a request can carry (L1's mutable part, a library entry, history, an item
attached this turn) is a ``Ladder`` of ``Rung``\\ s: its forms, each with its exact tokens
and the value of what it tells the model. The solver picks one rung a ladder to

    maximize   sum(value of the chosen rungs) - cache_price * (prefix tokens re-sent uncached)
               (+ regret, for the choice made as if the cache were free: 4.)
    subject to sum(tokens of the chosen rungs) <= room
               sum(tokens of the chosen text-free rungs) <= text_free (as far as room allows)

where the break is the first prefix ladder whose rung differs from last turn's (or whose
block a chosen rung changes: ``Rung.at``, a line joining an index before its entry): from
there on the provider reads the request uncached. What is priced is the cache the change
loses, from the break up to the latest break any request within the room allows
(``_latest``: past it nothing can stay cached, so a forced cut of history does not also
make every turn it keeps pay): for a ladder whose form lasts, the tokens of last turn's
rung (what it sends now is new content, uncached whatever the break); for one that does
not (history's suffix), the tokens it re-sends now of those last turn's sent (``_resent``:
a suffix started earlier sends the turns before them as new content). Only the *first* change
matters, so the solve is exact in the break point:

1. For each candidate break ``b`` in prefix order (and "no break"), the prefix ladders
   before ``b`` keep last turn's rungs; the rest are free: a lasting one's price is fixed
   by ``b`` (its forms are chosen by value alone), a passing one before the latest pays
   ``cache_price`` a token (a shear of its value: its hull keeps its vertices);
   a rung that changes a block before ``b`` pays its ``join`` (the cache between them).
2. The free ladders are a multiple-choice knapsack, solved by greedy on each ladder's
   upper convex hull: every ladder starts at its smallest rung, and hull steps are taken
   by falling value per token while they fit (a step that does not fit the room ends its
   ladder's climb; one over the text-free share is skipped); a last pass gives the
   room left to rungs on the hull or not, the most value per token first.
3. The best objective over the candidates wins; ties go to the later break (more cached).
   A climb prices a rung joining an earlier block by its ``join``, which may be less than
   the break it makes, so the exact objective also weighs the best break's climb before
   its last pass and last turn's choice (new units at their smallest).
4. Over turns: a change of the prefix is paid once, what it brings stays. The value the
   requests sent forgo (the choice were the cache free, cutting nothing sent, over
   theirs, in the ladders whose forms last: ``Ladder.lasting``) adds up turn by turn
   (``regret``); that choice is bought once its objective plus the regret reaches the
   best one's, and the regret starts over: ski rental, within twice the best choice for a
   chat of unknown length. A price paid in full every turn would keep a library cut for
   good once one large attachment made the room short.

5. The request as sent may hold more than the ladders (``Carried``: a batch's earlier
   messages): a break from the ladder where it begins on keeps the batch, so its room is
   less what it carries and the ladders the batch holds (``Carried.held``: entries whose
   messages it cannot send otherwise) keep last turn's rungs; a break before it, a
   choice over that room or one that changes a held ladder is the request sent as
   built, priced as a break at that ladder at the latest (re-sending of that ladder only
   its part from the batch's first message on, ``Carried.resent``).

The solve is a function of the ladders, the regret and what is carried alone: no clock,
no dict order, ties by position.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
from collections.abc import Collection, Sequence
from typing import NamedTuple

import attrs

__all__ = [
    "MAX_BREAKS",
    "Carried",
    "Hulls",
    "Ladder",
    "Rung",
    "Solution",
    "lasting_value",
    "rent",
    "scored",
    "solve",
    "topped",
]

MAX_BREAKS = 16
"""The most break points tried: the latest ones, where a break costs least, and then
evenly spread ones (a 1,600-entry library would otherwise be solved 1,600 times)."""


@attrs.frozen(cache_hash=True)
class Rung:
    """One form of a unit: its tokens and its value; ``text_free`` for forms without prose
    (an index line, a stub, a count). A form that changes another prefix unit's block
    instead of its own (a line joining an index that stands before the entry) names that
    unit's place in the prefix (``at``): the request breaks there, and a solve that keeps
    the prefix cached past ``at`` prices the rung ``join`` less (the cache between them)."""

    tokens: int
    value: float
    text_free: bool = False
    at: int | None = None
    join: float = 0.0
    bare: int = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(lambda r: r.tokens if r.text_free else 0, takes_self=True),
    )
    """The tokens it counts against the text-free share (none for a form with text)."""


@attrs.frozen(cache_hash=True)
class Ladder:
    """A unit's forms (any order) and the rung last turn's request sent (``previous``;
    None for a unit new this turn, which sits after every cached unit)."""

    rungs: tuple[Rung, ...]
    previous: int | None = None
    lasting: bool = True
    """Whether the form chosen stays in the requests after this one (a library entry, an
    item attached now), rather than giving way to the chat's growth (history's suffix)
    or leaving with its turn (a passage): the regret counts only what lasts."""
    smallest: int = attrs.field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(lambda ladder: _smallest(ladder.rungs), takes_self=True),
    )
    """Its smallest rung (then the most value, then the first): where a solve starts it."""


@attrs.frozen
class Solution:
    """One rung a ladder (``choice``), its tokens, value, first changed prefix ladder
    (``broken_at``; None: the whole prefix stays cached) and objective; the lasting value
    of the choice were the cache free (``free_value``: what a restore would bring) and
    whether the regret bought that choice (``bought``: the objective counts the regret)."""

    choice: tuple[int, ...]
    tokens: int
    value: float
    broken_at: int | None
    objective: float
    free_value: float = 0.0
    bought: bool = False
    sent_as_built: bool = False
    """Whether, against what is ``Carried``, the choice is sent as built (its prefix broken
    where the batch began) rather than extending the batch."""


@attrs.frozen
class Carried:
    """What the request as sent holds beyond the ladders while it extends the last one
    (``tokens``: earlier messages' indexes, references, restores, forms larger than the
    ladders'): a choice over the room less them, or one that changes a ladder before
    ``at`` (the first whose block the request as built sends otherwise than the batch
    did: the first entry it grew by, or history where it began), is sent as built
    instead, without them, and its prefix breaks at ``at`` at the latest."""

    at: int
    tokens: int
    resent: int | None = None
    """What sending it as built re-sends of the ladder at ``at`` if that ladder keeps last
    turn's rung (the part from the batch's first message on); None: all of it."""
    held: frozenset[int] = frozenset()
    """The ladders past ``at`` the batch holds as last turn sent them: a change to one
    sends the request as built too (a batch's message that cannot be sent otherwise)."""


def _cap(ladder: Ladder) -> int:
    """The most tokens a rung of ``ladder`` can re-send that last turn's request had
    cached: its form last turn (a suffix started earlier sends the turns before it as new
    content, read uncached whatever the break); any, for a unit new this turn."""
    return sys.maxsize if ladder.previous is None else ladder.rungs[ladder.previous].tokens


def _net(rung: Rung, price: float, cap: int) -> float:
    """A rung's value less ``price`` for each token it re-sends of the ``cap`` cached."""
    return rung.value - price * (rung.tokens if rung.tokens < cap else cap)


def _hull(rungs: Sequence[Rung], price: float, cap: int = sys.maxsize) -> list[int]:
    """Indices of ``rungs`` on the upper convex hull of (tokens, ``_net`` value), from the
    smallest rung up, each step of positive and falling slope."""
    if len(rungs) == 2:  # most ladders (a passage: absent or sent): the same, made directly
        a, b = rungs
        lo, hi = (1, 0) if (b.tokens, -b.value, 1) < (a.tokens, -a.value, 0) else (0, 1)
        first, second = rungs[lo], rungs[hi]
        if second.tokens == first.tokens or _net(second, price, cap) <= _net(first, price, cap):
            return [lo]
        return [lo, hi]
    order = sorted(range(len(rungs)), key=lambda i: (rungs[i].tokens, -rungs[i].value, i))
    nets = [_net(r, price, cap) for r in rungs]
    points: list[int] = []
    for i in order:
        tokens, v = rungs[i].tokens, nets[i]
        if points and rungs[points[-1]].tokens == tokens:
            continue  # same size, lower value (sorted)
        if points and v <= nets[points[-1]]:
            continue  # larger and worth no more
        while len(points) >= 2:
            p, q = points[-2], points[-1]
            va, at = nets[p], rungs[p].tokens
            # q is under the chord p -> i: drop it (slopes must fall)
            if (nets[q] - va) * (tokens - at) <= (v - va) * (rungs[q].tokens - at):
                points.pop()
            else:
                break
        points.append(i)
    return points


def _smallest(rungs: Sequence[Rung]) -> int:
    if len(rungs) == 2:
        a, b = rungs
        return 1 if (b.tokens, -b.value, 1) < (a.tokens, -a.value, 0) else 0
    return min(range(len(rungs)), key=lambda i: (rungs[i].tokens, -rungs[i].value, i))


def _within_share(
    ladders: Sequence[Ladder], start: list[int], room: int, text_free: int
) -> list[int]:
    """``start`` (each ladder's smallest rung) with text-free rungs swapped for the
    smallest rung with less of them, the fewest tokens per text-free token first, until
    the text-free share holds or the room is spent: the share binds the smallest forms
    too (a ladder whose only small forms are text-free grows to one with text)."""
    bare = sum(ladders[j].rungs[c].bare for j, c in enumerate(start))
    if bare <= text_free:
        return start
    used = sum(ladders[j].rungs[c].tokens for j, c in enumerate(start))
    moves: list[tuple[float, int, int]] = []
    for j, ladder in enumerate(ladders):
        now = ladder.rungs[start[j]]
        if not now.text_free:
            continue
        better = [i for i, r in enumerate(ladder.rungs) if r.bare < now.tokens]
        if better:
            i = min(better, key=lambda i: (ladder.rungs[i].tokens, -ladder.rungs[i].value, i))
            r = ladder.rungs[i]
            moves.append(((r.tokens - now.tokens) / (now.tokens - r.bare), j, i))
    out = list(start)
    for _, j, i in sorted(moves):
        if bare <= text_free:
            break
        now, new = ladders[j].rungs[out[j]], ladders[j].rungs[i]
        if used + new.tokens - now.tokens > room:
            continue
        used += new.tokens - now.tokens
        bare += new.bare - now.bare
        out[j] = i
    return out


class _Step(NamedTuple):
    """One step up a ladder's hull: its slope (value less price, per token) negated, the
    ladder and the rung it climbs to; steps sort best slope first, ties by place (a
    tuple: a solve makes and sorts a few of them for every ladder)."""

    fall: float
    ladder: int
    rung: int


def _climb(
    ladders: Sequence[Ladder],
    steps: Sequence[_Step],
    choice: list[int],
    fixed: Sequence[bool],
    room: int,
    bare: int,
    text_free: int,
) -> int:
    """Take ``steps`` (best slope first) while they fit ``room`` and the text-free
    share, from ``choice`` (in place); a step that does not fit the room ends its
    ladder's climb, one over the share only is skipped (the ladder's next step, to a
    form with text, goes from where it stands). The tokens used after."""
    stopped: set[int] = set()
    used = 0
    for step in steps:
        j = step.ladder
        if fixed[j] or j in stopped:
            continue
        old, new = ladders[j].rungs[choice[j]], ladders[j].rungs[step.rung]
        if new.tokens <= old.tokens:
            continue  # a later step of a ladder already climbed past this one
        grow = new.tokens - old.tokens
        bare_grow = new.bare - old.bare
        if used + grow > room:
            stopped.add(j)
            continue
        if bare_grow > 0 and bare + bare_grow > text_free:
            continue  # over the share: its next step (a form with text) may still be taken
        choice[j], used, bare = step.rung, used + grow, bare + bare_grow
    return used


def _topped(
    ladders: Sequence[Ladder],
    free: Sequence[int],
    prices: Sequence[float],
    choice: list[int],
    room: int,
    bare: int,
    text_free: int,
    barred: Collection[tuple[int, int]] = (),
) -> None:
    """The greedy's last pass (in place): the room the climb left goes move by move to
    the free ladders' rungs (but the ``barred`` (ladder, rung) pairs), on the hull or
    not, the most value per token first (a move that costs no tokens first of all), each
    ladder's best move found again as the room shrinks. (In ladder order, the first
    ladders took the room a later one would have used better.)"""

    def best(j: int) -> tuple[float, float, int, int] | None:
        """Ladder ``j``'s move of the most value per token (then value) that fits, as a
        heap entry: (-value per token, -value, ladder, rung)."""
        rungs, price, cap = ladders[j].rungs, prices[j], _cap(ladders[j])
        now = rungs[choice[j]]
        worth, now_bare, now_tokens = _net(now, price, cap), now.bare, now.tokens
        found: tuple[float, float, int, int] | None = None
        for i, r in enumerate(rungs):  # (``_net`` written out: this runs for every rung)
            grow = r.tokens - now_tokens
            if grow > room:
                continue
            bare_grow = r.bare - now_bare
            if bare_grow > 0 and bare + bare_grow > text_free:
                continue
            gain = r.value - price * (r.tokens if r.tokens < cap else cap) - worth
            if gain <= 0:
                continue
            if barred and (j, i) in barred:
                continue
            move = (-gain / grow if grow > 0 else -math.inf, -gain, j, i)
            if found is None or move < found:
                found = move
        return found

    heap = [move for j in free if (move := best(j)) is not None]
    heapq.heapify(heap)
    while heap:
        move = heapq.heappop(heap)
        j = move[2]
        again = best(j)  # the room or the share may have shrunk since it was found
        if again is None:
            continue
        if again != move:
            heapq.heappush(heap, again)
            continue
        now, new = ladders[j].rungs[choice[j]], ladders[j].rungs[move[3]]
        room -= new.tokens - now.tokens
        bare += new.bare - now.bare
        choice[j] = move[3]
        if (after := best(j)) is not None:
            heapq.heappush(heap, after)


def topped(
    ladders: Sequence[Ladder],
    choice: Sequence[int],
    room: int,
    text_free: int,
    free: Sequence[int],
    barred: Collection[tuple[int, int]] = (),
) -> tuple[int, ...]:
    """``choice`` with the room it leaves given to the ``free`` ladders, unpriced, by the
    greedy's last pass (``_topped``; never to the ``barred`` (ladder, rung) pairs)."""
    out = list(choice)
    used = sum(ladder.rungs[c].tokens for ladder, c in zip(ladders, out, strict=True))
    bare = sum(ladder.rungs[c].bare for ladder, c in zip(ladders, out, strict=True))
    _topped(ladders, free, [0.0] * len(ladders), out, room - used, bare, text_free, barred)
    return tuple(out)


def _holding(
    ladders: Sequence[Ladder], held: Collection[int], choice: list[int], fixed: Sequence[bool]
) -> tuple[list[bool], int, int]:
    """``choice`` (in place) with the ``held`` ladders at last turn's rungs, as a batch
    kept holds them (``Carried.held``): the ladders fixed after, and the tokens and the
    text-free tokens that adds."""
    kept = list(fixed)
    grew = bare_grew = 0
    for j in sorted(held):
        if kept[j]:
            continue
        previous = ladders[j].previous
        assert previous is not None
        old, new = ladders[j].rungs[choice[j]], ladders[j].rungs[previous]
        grew += new.tokens - old.tokens
        bare_grew += new.bare - old.bare
        choice[j], kept[j] = previous, True
    return kept, grew, bare_grew


def _places(ladders: Sequence[Ladder], prefix: Sequence[int]) -> list[int]:
    """Each ladder's place in the prefix (``len(ladders)``: not in it)."""
    places = [len(ladders)] * len(ladders)
    for p, j in enumerate(prefix):
        places[j] = p
    return places


def _held_until(
    ladders: Sequence[Ladder], start: Sequence[int], prefix: Sequence[int], b: int
) -> list[int]:
    """``start`` with the prefix ladders before break ``b`` at last turn's rungs."""
    choice = list(start)
    for j in prefix[:b]:
        previous = ladders[j].previous
        assert previous is not None
        choice[j] = previous
    return choice


def _breaks(prefix: Sequence[int]) -> set[int]:
    """Candidate break points (positions in ``prefix``, plus ``len(prefix)``: no break),
    at most ``MAX_BREAKS``: the latest half, then evenly spread earlier ones."""
    n = len(prefix)
    every = list(range(n + 1))
    if len(every) <= MAX_BREAKS:
        return set(every)
    late = every[-(MAX_BREAKS // 2) :]
    early = every[: -(MAX_BREAKS // 2)]
    step = len(early) / (MAX_BREAKS - len(late))
    spread = sorted({early[int(k * step)] for k in range(MAX_BREAKS - len(late))})
    return {*spread, *late}


def scored(
    ladders: Sequence[Ladder],
    choice: Sequence[int],
    cache_price: float,
    room: int | None = None,
    carried: Carried | None = None,
) -> Solution:
    """``choice`` as a solution: its tokens, value, objective and first changed prefix
    ladder (None: none). With ``room``, a prefix ladder past the ones any request within
    it could keep cached (``_latest``) pays nothing: it is read uncached whatever the
    choice; with ``carried`` too, a choice over the room less it breaks at
    ``Carried.at`` at the latest."""
    prefix = [j for j, ladder in enumerate(ladders) if ladder.previous is not None]
    latest = len(prefix) if room is None else _latest(ladders, prefix, room)
    settle = None if room is None else _settle(_places(ladders, prefix), len(prefix), room, carried)
    return _solution(ladders, choice, cache_price, prefix, latest, settle)


class _Settle(NamedTuple):
    """``Carried`` as ``_score`` reads it: the prefix place of ``Carried.at``, the room
    less what is carried, ``Carried.resent`` and ``Carried.held``."""

    place: int
    room: int
    resent: int | None
    held: frozenset[int]


def _settle(
    places: Sequence[int], prefixed: int, room: int, carried: Carried | None
) -> _Settle | None:
    """``carried`` as ``_score`` reads it (``places``: each ladder's prefix place,
    ``prefixed`` past the prefix)."""
    if carried is None or carried.tokens <= 0:
        return None
    place = places[carried.at] if carried.at < len(places) else prefixed
    return _Settle(min(place, prefixed), room - carried.tokens, carried.resent, carried.held)


def _score(
    ladders: Sequence[Ladder],
    choice: Sequence[int],
    cache_price: float,
    prefix: Sequence[int],
    latest: int,
    settle: _Settle | None = None,
) -> tuple[float, int | None, bool]:
    """``choice``'s objective, first changed prefix ladder and whether it is sent as
    built; with ``settle``, a choice over its room or that changes a ladder the batch
    holds is sent as built: its prefix breaks at its place at the latest, re-sending
    ``_Settle.resent`` of the ladder there if that ladder keeps last turn's rung."""
    broken = next((p for p, j in enumerate(prefix) if choice[j] != ladders[j].previous), None)
    for ladder, c in zip(ladders, choice, strict=True):
        at = ladder.rungs[c].at
        if at is not None and c != ladder.previous and (broken is None or at < broken):
            broken = at  # the rung changes the block at ``at``: the request breaks there
    partial = None
    if settle is not None and (broken is None or settle.place < broken):
        tokens = sum(ladder.rungs[c].tokens for ladder, c in zip(ladders, choice, strict=True))
        if tokens > settle.room or any(choice[j] != ladders[j].previous for j in settle.held):
            broken, partial = settle.place, settle.resent
    value = sum(ladder.rungs[c].value for ladder, c in zip(ladders, choice, strict=True))
    uncached = (
        0 if broken is None else sum(_resent(ladders[j], choice[j]) for j in prefix[broken:latest])
    )
    if partial is not None and broken is not None and broken < latest:
        # Sent as built, the ladder where it breaks re-sends only its part from there on.
        whole = _resent(ladders[prefix[broken]], choice[prefix[broken]])
        uncached -= whole - min(partial, whole)
    first = None if broken is None or broken >= len(prefix) else prefix[broken]
    built = settle is not None and broken is not None and broken <= settle.place
    return value - cache_price * uncached, first, built


def _resent(ladder: Ladder, c: int) -> int:
    """The tokens a prefix ladder after the break re-sends uncached that last turn's
    request had cached: a lasting unit's form last turn (what it sends now is new content,
    read uncached whatever the break), a unit sent for this turn only (history's suffix,
    cut again as the chat grows) the tokens it re-sends now, at most last turn's (a suffix
    started earlier sends the turns before those as new content)."""
    if ladder.lasting:
        return ladder.rungs[ladder.previous or 0].tokens
    return min(ladder.rungs[c].tokens, _cap(ladder))


def _latest(ladders: Sequence[Ladder], prefix: Sequence[int], room: int) -> int:
    """How many prefix ladders a request within ``room`` can keep as last turn sent them
    (every other ladder at its smallest rung): the cache a change can lose ends there,
    past it the prefix is read uncached whatever the solve chooses."""
    small = [ladder.rungs[ladder.smallest].tokens for ladder in ladders]
    used = sum(small)
    for p, j in enumerate(prefix):
        previous = ladders[j].previous
        assert previous is not None
        used += ladders[j].rungs[previous].tokens - small[j]
        if used > room:
            return p
    return len(prefix)


@attrs.define
class Hulls:
    """What one budget stage's solves share, since most ladders are the same, in the same
    place, from one round to the next: hull steps by ladder, price and place
    (``steps``), and the last solve's ladders, their prices, the ladders left out (those
    whose rungs join an earlier block) and the others' steps sorted (``last``), which the
    next solve sorts again only where its ladders changed."""

    steps: dict[tuple[Ladder, float, int], tuple[_Step, ...]] = attrs.Factory(dict)
    last: tuple[tuple[Ladder, ...], tuple[float, ...], frozenset[int], list[_Step]] | None = None


def _steps(
    ladder: Ladder, price: float, j: int, hulls: Hulls | None = None
) -> tuple[_Step, ...]:
    """The hull steps of ``ladder`` (the ``j``-th), from its smallest rung up (found in
    ``hulls`` when made there before)."""
    found = None if hulls is None else hulls.steps.get((ladder, price, j))
    if found is None:
        steps: list[_Step] = []
        rungs, cap = ladder.rungs, _cap(ladder)
        hull = _hull(rungs, price, cap)
        for a, b in itertools.pairwise(hull):
            ra, rb = rungs[a], rungs[b]
            gain = _net(rb, price, cap) - _net(ra, price, cap)
            if gain > 0:
                steps.append(_Step(-(gain / max(1, rb.tokens - ra.tokens)), j, b))
        found = tuple(steps)
        if hulls is not None:
            hulls.steps[ladder, price, j] = found
    return found


def _sorted_steps(
    ladders: Sequence[Ladder], prices: Sequence[float], joined: frozenset[int], hulls: Hulls | None
) -> list[_Step]:
    """The hull steps of every ladder but the ``joined``, best first: the last solve's
    (``Hulls.last``) with those of the ladders or prices that changed since made again
    (a few, from one round to the next), else all of them."""
    n = len(ladders)
    steps: list[_Step] | None = None
    last = None if hulls is None else hulls.last
    if last is not None and len(last[0]) == n and last[2] == joined:
        before, paid, _, kept = last
        changed = {
            j
            for j in range(n)
            if j not in joined and (ladders[j] is not before[j] or prices[j] != paid[j])
        }
        if not changed:
            steps = kept
        elif len(changed) <= n // 2:
            steps = [s for s in kept if s.ladder not in changed]
            steps += (s for j in sorted(changed) for s in _steps(ladders[j], prices[j], j, hulls))
            steps.sort()  # a sorted run and a few new steps
    if steps is None:
        steps = [
            s for j in range(n) if j not in joined for s in _steps(ladders[j], prices[j], j, hulls)
        ]
        steps.sort()
    if hulls is not None:
        hulls.last = (tuple(ladders), tuple(prices), joined, steps)
    return steps


def _priced(ladder: Ladder, b: int) -> Ladder:
    """``ladder`` as a solve that keeps the first ``b`` prefix ladders cached sees it: a
    rung that changes a block before ``b`` (``Rung.at``) is worth its ``join`` less."""
    rungs = tuple(
        attrs.evolve(r, value=r.value - r.join) if r.join and r.at is not None and r.at < b else r
        for r in ladder.rungs
    )
    return attrs.evolve(ladder, rungs=rungs)


def solve(
    ladders: Sequence[Ladder],
    room: int,
    *,
    cache_price: float = 0.0,
    text_free: int = 0,
    regret: float = 0.0,
    carried: Carried | None = None,
    hulls: Hulls | None = None,
) -> Solution | None:
    """The choice of one rung a ladder that maximizes the objective (module docstring)
    within ``room`` tokens, text-free rungs within ``text_free`` (the smallest forms too,
    as far as the room allows: ``_within_share``); None when not even the smallest rungs
    fit. A candidate break ``b`` prices each rung that changes a block before ``b`` its
    ``join`` less (``_priced``); every candidate is scored by the exact objective (``_score``).

    ``regret`` is the value the requests sent have forgone since the last buy (``_free``'s
    value over theirs, turn by turn): the choice the solve makes when the cache is free is
    bought once its objective plus the regret reaches the best one's (ski rental: a change
    of the prefix is paid once, what it brings stays every turn after; paying once the
    value forgone reaches the cache it costs is within twice the best choice for a chat
    of unknown length). Keeping the batch (``carried``), the best choice's break is rent
    it pays this turn: it counts in this turn's buy as the turns before's do (ski rental
    buys on the day the rent paid would reach the price, not the day after). ``hulls``
    keeps the ladders' hull steps for the next solve (the same choice, made faster where
    the ladders repeat)."""
    n = len(ladders)
    prefix = [j for j, ladder in enumerate(ladders) if ladder.previous is not None]
    at = _places(ladders, prefix)
    settle = _settle(at, len(prefix), room, carried)

    def rooms(b: int) -> tuple[int, ...]:
        """The rooms a break ``b`` may have: less what the batch carries from its place on,
        the whole room before it and there (the request is then sent as built)."""
        if settle is None or b < settle.place:
            return (room,)
        return (room, settle.room) if b == settle.place else (settle.room,)

    smallest = [ladder.smallest for ladder in ladders]
    start = _within_share(ladders, smallest, room, text_free)
    latest = _latest(ladders, prefix, room)
    prices = [cache_price if at[j] < latest and not ladders[j].lasting else 0.0 for j in range(n)]
    joins = sorted({r.at for ladder in ladders for r in ladder.rungs if r.at is not None})
    joined = frozenset(j for j, ladder in enumerate(ladders) if any(r.join for r in ladder.rungs))
    plain = _sorted_steps(ladders, prices, joined, hulls)
    regimes: dict[tuple[bool, ...], tuple[list[Ladder], list[_Step]]] = {}
    variants: dict[tuple[int, tuple[bool, ...]], tuple[Ladder, tuple[_Step, ...]]] = {}

    def regime(b: int) -> tuple[list[Ladder], list[_Step]]:
        """The ladders as priced for break ``b`` and their steps (the same for every ``b``
        between the same two index places; a ladder's the same for every ``b`` between
        its own rungs' ``at``)."""
        key = tuple(a < b for a in joins)
        if key not in regimes:
            priced = list(ladders)
            moving: list[_Step] = []
            for j in sorted(joined):
                mine = tuple(r.at is not None and r.at < b for r in ladders[j].rungs)
                if (j, mine) not in variants:
                    ladder = _priced(ladders[j], b)
                    variants[j, mine] = (ladder, _steps(ladder, prices[j], j))
                priced[j], steps = variants[j, mine]
                moving += steps
            regimes[key] = (priced, sorted([*plain, *moving]) if moving else plain)
        return regimes[key]

    start_used = sum(ladders[j].rungs[start[j]].tokens for j in range(n))
    start_bare = sum(ladders[j].rungs[start[j]].bare for j in range(n))
    climbs: list[tuple[float, int, tuple[int, ...], int]] = []  # each candidate's solve
    fixed_used = fixed_bare = 0
    fixed_start = fixed_start_bare = 0
    candidates = _breaks(prefix) | {a for a in joins if a <= len(prefix)}
    if settle is not None:
        candidates.add(settle.place)
    for b in range(len(prefix) + 1):
        if b > 0:
            j = prefix[b - 1]
            previous = ladders[j].previous
            assert previous is not None
            fixed_used += ladders[j].rungs[previous].tokens
            fixed_bare += ladders[j].rungs[previous].bare
            fixed_start += ladders[j].rungs[start[j]].tokens
            fixed_start_bare += ladders[j].rungs[start[j]].bare
        if b not in candidates:
            continue
        used = fixed_used + start_used - fixed_start
        if fixed_used > max(rooms(b)):
            break  # a later break fixes more: it cannot fit either
        base = _held_until(ladders, start, prefix, b)
        bare = fixed_bare + start_bare - fixed_start_bare
        fixed = [p < b for p in at]
        priced, steps = regime(b)
        for r in rooms(b):
            choice, stays, taken, bare_taken = list(base), fixed, used, bare
            if settle is not None and r == settle.room and settle.held:
                stays, grew, bare_grew = _holding(ladders, settle.held, choice, fixed)
                taken, bare_taken = taken + grew, bare_taken + bare_grew
            if taken > r:
                continue
            _climb(priced, steps, choice, stays, r - taken, bare_taken, text_free)
            score = _score(ladders, choice, cache_price, prefix, latest, settle)[0]
            climbs.append((score, b, tuple(choice), r))
    if not climbs:
        return None
    top, b, climbed, r = max(climbs)  # ties to the later break
    priced, _ = regime(b)
    choice = list(climbed)
    held = set(prefix[:b])
    if settle is not None and r == settle.room:
        held |= settle.held
    free = [j for j in range(n) if j not in held]
    used = sum(ladders[j].rungs[choice[j]].tokens for j in range(n))
    bare = sum(ladders[j].rungs[choice[j]].bare for j in range(n))
    tail = [
        cache_price if b <= at[j] < latest and not ladders[j].lasting else 0.0 for j in range(n)
    ]
    _topped(priced, free, tail, choice, r - used, bare, text_free)
    solution = _solution(ladders, choice, cache_price, prefix, latest, settle)
    if solution.objective < top:  # the last pass, on join-priced values, did worse
        solution = _solution(ladders, climbed, cache_price, prefix, latest, settle)
    last = _last_turns(ladders, start, room, text_free)
    if last is not None:
        # A climb prices a rung joining an earlier block by its ``join``, which may be
        # less than the break it makes: last turn's choice is a candidate too.
        kept = _solution(ladders, last, cache_price, prefix, latest, settle)
        solution = kept if kept.objective > solution.objective else solution
    if not cache_price or last is None:
        return solution
    # The free choice climbs every lasting ladder unpriced: the plain steps of those
    # (a lasting ladder's price is 0), the joined ones' steps without their joins.
    lasting = [
        *(s for s in plain if ladders[s.ladder].lasting),
        *(
            s
            for j in sorted(joined)
            if ladders[j].lasting
            for s in _steps(ladders[j], 0.0, j, hulls)
        ),
    ]
    free_choice = _free(ladders, last, room, text_free, sorted(lasting))
    bought = _solution(ladders, free_choice, cache_price, prefix, latest, settle)
    best = solution.objective
    regret += rent(solution, extending=carried is not None)
    if regret > 0 and bought.choice != solution.choice and bought.objective + regret >= best:
        solution = attrs.evolve(bought, objective=bought.objective + regret, bought=True)
    return attrs.evolve(solution, free_value=lasting_value(ladders, bought.choice))


def _solution(
    ladders: Sequence[Ladder],
    choice: Sequence[int],
    cache_price: float,
    prefix: Sequence[int],
    latest: int,
    settle: _Settle | None = None,
) -> Solution:
    """``choice`` scored (``_score``) as a solution."""
    score, broken, built = _score(ladders, choice, cache_price, prefix, latest, settle)
    tokens = sum(ladder.rungs[c].tokens for ladder, c in zip(ladders, choice, strict=True))
    value = sum(ladder.rungs[c].value for ladder, c in zip(ladders, choice, strict=True))
    return Solution(tuple(choice), tokens, value, broken, score, sent_as_built=built)


def rent(solution: Solution, *, extending: bool) -> float:
    """What ``solution`` pays to keep the batch (``extending``: solved against what it
    carries): the cache its break loses (``value - objective``), where it extends the
    batch rather than being sent as built and breaks the prefix; else none."""
    if not extending or solution.sent_as_built or solution.broken_at is None:
        return 0.0
    return max(0.0, solution.value - solution.objective)


def lasting_value(ladders: Sequence[Ladder], choice: Sequence[int]) -> float:
    """The value ``choice`` gives the ladders whose forms last (``Ladder.lasting``)."""
    return sum(
        ladder.rungs[c].value for ladder, c in zip(ladders, choice, strict=True) if ladder.lasting
    )


def _last_turns(
    ladders: Sequence[Ladder], start: Sequence[int], room: int, text_free: int
) -> tuple[int, ...] | None:
    """Last turn's choice, new ladders at their smallest rung (``_plain``), if it fits the
    room and the share (as far as ``start``, the smallest forms within it, does)."""
    choice = tuple(
        ladder.previous if ladder.previous is not None else _plain(ladder, start[j])
        for j, ladder in enumerate(ladders)
    )
    rungs = [ladder.rungs[c] for ladder, c in zip(ladders, choice, strict=True)]
    share = max(text_free, sum(ladders[j].rungs[c].bare for j, c in enumerate(start)))
    if sum(r.tokens for r in rungs) > room or sum(r.bare for r in rungs) > share:
        return None
    return choice


def _plain(ladder: Ladder, fallback: int) -> int:
    """A new ladder's rung in last turn's choice: its smallest, the one that changes no
    earlier block or the latest one (then the most value); ``fallback`` when that is as
    small and changes none."""
    if ladder.rungs[fallback].at is None:
        return fallback
    rungs = ladder.rungs
    return min(
        range(len(rungs)),
        key=lambda i: (
            rungs[i].tokens,
            rungs[i].at is not None,
            -(rungs[i].at or 0),
            -rungs[i].value,
            i,
        ),
    )


def _free(
    ladders: Sequence[Ladder],
    last: Sequence[int],
    room: int,
    text_free: int,
    steps: Sequence[_Step],
) -> list[int]:
    """The room's best use were the cache free, cutting nothing last turn sent (``last``):
    every lasting ladder climbs from there (``steps``: their hull steps, unpriced, best
    first), the others stay (what a restore would bring)."""
    n = len(ladders)
    held = [not ladder.lasting for ladder in ladders]
    choice = list(last)
    used = sum(ladders[j].rungs[c].tokens for j, c in enumerate(choice))
    bare = sum(ladders[j].rungs[c].bare for j, c in enumerate(choice))
    used += _climb(ladders, steps, choice, held, room - used, bare, text_free)
    bare = sum(ladders[j].rungs[c].bare for j, c in enumerate(choice))
    free = [j for j in range(n) if not held[j]]
    _topped(ladders, free, [0.0] * n, choice, room - used, bare, text_free)
    return choice
