"""The budget's solver on hand-built ladders, and its promises over random ones."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.pipeline._budget.objective import _Choice, _passages_beside, _plain_passages, _Unit
from lamina.pipeline._budget.solver import (
    Carried,
    Hulls,
    Ladder,
    Rung,
    Solution,
    _sorted_steps,
    scored,
    solve,
    topped,
)


def _objective(
    ladders: list[Ladder], choice: tuple[int, ...], price: float, room: int | None = None
) -> tuple[float, int | None]:
    """A choice's objective and first changed prefix ladder (``scored``)."""
    done = scored(ladders, choice, price, room)
    return done.objective, done.broken_at


FULL, PREVIEW, STUB = Rung(1000, 1000.0), Rung(300, 550.0), Rung(40, 20.0, text_free=True)


def test_everything_fits_nothing_changes() -> None:
    ladders = [Ladder((FULL, PREVIEW, STUB), previous=0), Ladder((FULL, PREVIEW, STUB))]
    done = solve(ladders, 5000, cache_price=0.5, text_free=400)
    assert done is not None
    assert done.choice == (0, 0) and done.broken_at is None and done.tokens == 2000


def test_a_cut_falls_where_it_breaks_least() -> None:
    """Three library entries sent whole last turn and a new item: the room for the item
    comes from the last entry, not the first (a cut at the front uncaches all)."""
    ladders = [Ladder((FULL, PREVIEW, STUB), previous=0) for _ in range(3)]
    ladders.append(Ladder((FULL, PREVIEW)))
    done = solve(ladders, 3000, cache_price=0.3, text_free=400)
    assert done is not None
    assert done.choice[:2] == (0, 0) and done.broken_at == 2
    assert done.tokens <= 3000


def test_restore_when_the_room_is_back() -> None:
    """An entry cut last turn comes back whole once it fits, worth its price."""
    ladders = [Ladder((FULL, PREVIEW, STUB), previous=1), Ladder((Rung(200, 200.0),))]
    done = solve(ladders, 1500, cache_price=0.3, text_free=400)
    assert done is not None and done.choice == (0, 0)


def test_no_restore_that_the_cache_price_outweighs() -> None:
    """A small gain at the front of a long cached prefix is not worth the break."""
    small = Ladder((Rung(60, 60.0), Rung(50, 55.0)), previous=1)
    long_prefix = [Ladder((FULL,), previous=0) for _ in range(5)]
    done = solve([small, *long_prefix], 10_000, cache_price=0.3, text_free=400)
    assert done is not None and done.choice[0] == 1 and done.broken_at is None


def test_the_regret_buys_back_what_the_cache_price_holds_back() -> None:
    """An entry cut at the front of a cached prefix: in one turn the price keeps it cut,
    the value it misses adds up turn by turn (``free_value`` over the solution's), and
    once that regret reaches what the break costs more than it brings (856 here: the
    cache it loses, 0.9 of the 2,040 tokens last turn's request sent from the entry on,
    against a gain of 980 a turn) the restore is bought, its objective counting the
    regret."""
    ladders = [Ladder((FULL, STUB), previous=1)]
    ladders += [Ladder((Rung(500, 500.0),), previous=0) for _ in range(4)]
    regret, turns = 0.0, 0
    while done := solve(ladders, 5000, cache_price=0.9, text_free=400, regret=regret):
        if done.bought or turns > 5:
            break
        assert done.choice[0] == 1 and done.broken_at is None
        regret += done.free_value - done.value
        turns += 1
    assert done is not None and turns == 1 and regret == 980
    assert done.choice == (0, 0, 0, 0, 0) and done.broken_at == 0
    assert done.objective == scored(ladders, done.choice, 0.9, 5000).objective + regret


def test_no_regret_where_a_restore_would_cut_what_was_sent() -> None:
    """Room for one of two entries whole: the cut one stays cut however large the regret
    (bringing it back would cut the other), and none accrues: no churn between them."""
    ladders = [Ladder((FULL, STUB), previous=0), Ladder((FULL, STUB), previous=1)]
    done = solve(ladders, 1100, cache_price=0.9, regret=10_000.0)
    assert done is not None and done.choice == (0, 1) and not done.bought
    assert done.free_value == done.value


def test_text_free_forms_share_one_bound() -> None:
    """Stubs take no more than the text-free share when a choice is left."""
    ladders = [Ladder((Rung(0, 0.0), STUB)) for _ in range(10)]
    done = solve(ladders, 10_000, text_free=100)
    assert done is not None
    assert sum(ladders[j].rungs[c].tokens for j, c in enumerate(done.choice)) <= 100


def test_the_text_free_share_binds_the_smallest_forms_too() -> None:
    """Ten items whose smallest form is a 30-token line (text-free) and whose next is a
    50-token preview: with a 100-token share, seven grow to previews (the lines left
    take 90), as the room allows; without the room, the lines stay (the hard floor)."""
    item = Ladder((Rung(30, 10.0, text_free=True), Rung(50, 20.0), Rung(400, 100.0)))
    done = solve([item] * 10, 10 * 50, text_free=100)
    assert done is not None
    lines = [c for c in done.choice if item.rungs[c].text_free]
    assert len(lines) * 30 <= 100 and done.tokens <= 500
    tight = solve([item] * 10, 10 * 30, text_free=100)
    assert tight is not None and tight.choice == (0,) * 10


def test_a_count_joining_an_index_breaks_the_prefix_at_the_index_once() -> None:
    """An index first in the prefix, then five 100-token entries whose count joins it
    (``at=0``), pricing the cache between them (``join``) when the index stays cached:
    counting three to fit 250 tokens breaks the request at the index, and is priced so
    once (the exhaustive optimum), not once an entry: the cache it loses, what last turn
    sent from the index on as far as any request in 250 tokens could keep it cached (the
    index and two entries; past them the prefix is read uncached whatever the choice)."""
    price = 0.3
    index = Ladder((Rung(50, 10.0, text_free=True),), previous=0)
    entries = [
        Ladder(
            (Rung(100, 100.0), Rung(0, 0.0, text_free=True, at=0, join=price * (50 + 100 * i))),
            previous=0,
        )
        for i in range(5)
    ]
    ladders = [index, *entries]
    done = solve(ladders, 250, cache_price=price, text_free=1000)
    assert done is not None and done.tokens <= 250 and done.broken_at == 0
    assert done.choice[0] == 0 and sorted(done.choice[1:]) == [0, 0, 1, 1, 1]
    best = max(
        scored(ladders, choice, price, 250).objective
        for choice in itertools.product(*(range(len(ladder.rungs)) for ladder in ladders))
        if sum(ladder.rungs[c].tokens for ladder, c in zip(ladders, choice, strict=True)) <= 250
    )
    assert done.objective == pytest.approx(best) == 210.0 - price * 250
    # One entry counted: the request still breaks at the index, not at the entry.
    assert _objective(ladders, (0, 0, 0, 0, 0, 1), price) == (410.0 - price * 550, 0)


def test_a_forced_cut_keeps_what_fits() -> None:
    """History sent last turn in 1,000 tokens, now in a room of 700: the prefix breaks
    there whatever the solve keeps, so keeping the most that fits pays no cache price (the
    kept turns are not worth 0.9 a token, which once cut them all)."""
    history = Ladder(
        (Rung(0, 0.0), Rung(300, 240.0), Rung(600, 480.0), Rung(1000, 800.0)),
        previous=3,
        lasting=False,
    )
    done = solve([history], 700, cache_price=0.9)
    assert done is not None and done.choice == (2,) and done.broken_at == 0
    assert done.objective == scored([history], (2,), 0.9, 700).objective == 480.0
    # Where the whole fits, a cut pays for the tokens it re-sends uncached (history gives
    # way to the chat's growth: what it re-sends now, not what last turn sent).
    assert _objective([history], (2,), 0.9, 1000) == (480.0 - 0.9 * 600, 0)
    # A unit whose form lasts pays the cache it loses: what last turn sent.
    lasting = attrs.evolve(history, lasting=True)
    assert _objective([lasting], (2,), 0.9, 1000) == (480.0 - 0.9 * 1000, 0)


def test_a_suffix_started_earlier_pays_only_for_the_turns_it_re_sends() -> None:
    """History sent last turn in 100 tokens, and offered started earlier (300 tokens, the
    200 before them worth 0.5 a token, under the 0.7 cache price): the break re-sends the
    100 tokens last turn had cached, and the 200 before them are new content, uncached
    whatever the break. So starting earlier is worth 200 - 0.7 * 100 = 130 against 100
    kept; priced on all 300 re-sent (-10), a suffix once cut never grew back."""
    history = Ladder((Rung(100, 100.0), Rung(300, 200.0), Rung(50, 50.0)), 0, lasting=False)
    assert _objective([history], (1,), 0.7, 1000) == (200.0 - 0.7 * 100, 0)
    assert _objective([history], (2,), 0.7, 1000) == (50.0 - 0.7 * 50, 0)  # a cut: all kept
    done = solve([history], 1000, cache_price=0.7)
    assert done is not None and done.choice == (1,) and done.objective == 130.0


def test_a_ladders_facts_follow_its_rungs() -> None:
    """``Rung.bare`` and ``Ladder.smallest`` are made with the value, so a ladder evolved
    (as a solve prices one for a break) has them for its new rungs, and they take no part
    in equality: a ladder is the same key of the solves' hull cache however made."""
    a, b = Rung(40, 20.0, text_free=True), Rung(40, 30.0)
    ladder = Ladder((FULL, a, b))
    assert (a.bare, b.bare, FULL.bare) == (40, 0, 0)
    assert ladder.smallest == 2  # same size, more value
    cheaper = attrs.evolve(ladder, rungs=(FULL, a, attrs.evolve(b, value=10.0)))
    assert cheaper.smallest == 1
    assert cheaper == Ladder(cheaper.rungs) and hash(cheaper) == hash(Ladder(cheaper.rungs))


def test_none_when_even_the_smallest_forms_do_not_fit() -> None:
    assert solve([Ladder((PREVIEW, FULL))], 299) is None


def test_greedy_takes_the_best_slope_first() -> None:
    """Two items share 1,300 tokens: both as previews and one whole beats one whole alone."""
    ladders = [Ladder((FULL, PREVIEW)), Ladder((FULL, PREVIEW))]
    done = solve(ladders, 1300)
    assert done is not None and sorted(done.choice) == [0, 1] and done.tokens == 1300


def test_the_room_the_climb_leaves_goes_to_the_most_value_per_token() -> None:
    """Neither ladder's hull step fits 100 tokens (each hull skips its middle rung), so
    the last pass shares the room: the second ladder's middle rung (3 a token) before
    the first's (about 1 a token), not the first ladder's because it comes first."""
    first = Ladder((Rung(0, 0.0), Rung(90, 95.0), Rung(200, 400.0)))
    second = Ladder((Rung(0, 0.0), Rung(50, 150.0), Rung(300, 1200.0)))
    done = solve([first, second], 100)
    assert done is not None and done.choice == (0, 1) and done.value == 150.0


def test_a_top_up_gives_the_room_left_to_the_free_ladders_but_their_barred_rungs() -> None:
    """60 tokens left: the second ladder's best move (its 50-token rung, 3 a token) is
    barred (a preview not made yet), so the room goes to its 40-token rung and the first
    ladder's 20-token one; the third ladder is not free and keeps its rung."""
    first = Ladder((Rung(0, 0.0), Rung(20, 30.0), Rung(90, 95.0)))
    second = Ladder((Rung(0, 0.0), Rung(40, 60.0), Rung(50, 150.0)))
    third = Ladder((Rung(0, 0.0), Rung(10, 100.0)))
    ladders = [first, second, third]
    assert topped(ladders, (0, 0, 0), 60, 0, [0, 1]) == (0, 2, 0)
    assert topped(ladders, (0, 0, 0), 60, 0, [0, 1], {(1, 2)}) == (1, 1, 0)


def test_a_top_up_keeps_the_text_free_share() -> None:
    """A line (text-free) is worth the most a token, but the share holds 10 tokens."""
    line = Ladder((Rung(0, 0.0), Rung(30, 90.0, text_free=True)))
    text = Ladder((Rung(0, 0.0), Rung(60, 60.0)))
    assert topped([line, text], (0, 0), 100, 10, [0, 1]) == (0, 1)
    assert topped([line, text], (0, 0), 100, 30, [0, 1]) == (1, 1)


def _grown_library() -> list[Ladder]:
    """An entry the system message holds (1,000 tokens) and three the batch's messages sent
    after it (300 tokens each, or a 40-token stub), all as last turn sent them."""
    grown = Ladder((Rung(300, 300.0), Rung(40, 40.0, text_free=True)), previous=0)
    return [Ladder((FULL, PREVIEW, STUB), previous=0), grown, grown, grown]


def test_what_the_batch_carries_is_made_room_for_at_its_end() -> None:
    """The request fits as built (1,900 of 2,000) but the batch's messages carry 200
    tokens more: the last entry they sent is cut (the cache breaks there, 0.9 of its 300
    tokens), not the request sent as built (all 900 of the growth re-sent)."""
    ladders = _grown_library()
    kept = solve(ladders, 2000, cache_price=0.9, text_free=400)
    assert kept is not None and kept.choice == (0, 0, 0, 0) and kept.broken_at is None
    done = solve(ladders, 2000, cache_price=0.9, text_free=400, carried=Carried(1, 200))
    assert done is not None
    assert done.choice == (0, 0, 0, 1) and done.broken_at == 3 and done.tokens == 1640
    assert done.objective == 1640.0 - 0.9 * 300


def test_a_request_that_fits_only_as_built_breaks_where_the_growth_begins() -> None:
    """What the batch carries leaves no room for the system message's entry: the request
    is sent as built, every form kept, priced as a break at the first entry it grew by."""
    ladders = _grown_library()
    done = solve(ladders, 2000, cache_price=0.9, text_free=400, carried=Carried(1, 1500))
    assert done is not None
    assert done.choice == (0, 0, 0, 0) and done.broken_at == 1
    assert done.objective == scored(ladders, done.choice, 0.9, 2000, Carried(1, 1500)).objective
    assert done.objective == 1900.0 - 0.9 * 900


def test_a_batch_begun_inside_history_re_sends_only_its_messages_when_sent_as_built() -> None:
    """History's suffix (1,000 tokens; cut, 400) after an entry: the batch's messages carry
    200 tokens and begin in the suffix's last 100. Sent as built, the request re-sends
    those 100 (0.9 x 100), less than the cut's loss (500 of value, 400 re-sent), so it
    is; priced as re-sending the whole suffix, the cut would win (860 against 900)."""
    history = Ladder((Rung(1000, 800.0), Rung(400, 300.0)), previous=0, lasting=False)
    ladders = [Ladder((FULL, PREVIEW, STUB), previous=0), history]
    done = solve(ladders, 2000, cache_price=0.9, carried=Carried(1, 200, resent=100))
    assert done is not None and done.choice == (0, 0) and done.broken_at == 1
    assert done.objective == 1800.0 - 0.9 * 100
    whole = solve(ladders, 2000, cache_price=0.9, carried=Carried(1, 200))
    assert whole is not None and whole.choice == (0, 1)
    assert whole.objective == 1300.0 - 0.9 * 400


def test_a_batch_kept_holds_the_entries_it_cannot_shed_from() -> None:
    """The second grown entry is one the batch cannot shed from (``Carried.held``): a
    choice that keeps the batch leaves it as sent and cuts the third (the cache breaks
    there), and one that cuts it is priced as the request sent as built, a break where
    the growth begins (all 900 of it re-sent), however little that choice is over."""
    ladders = _grown_library()
    held = Carried(1, 200, held=frozenset({2}))
    done = solve(ladders, 2000, cache_price=0.9, text_free=400, carried=held)
    assert done is not None
    assert done.choice == (0, 0, 0, 1) and done.broken_at == 3 and not done.sent_as_built
    cut = scored(ladders, (0, 0, 1, 0), 0.9, 2000, held)
    assert cut.broken_at == 1 and cut.sent_as_built
    assert cut.objective == 1640.0 - 0.9 * 900
    free = scored(ladders, (0, 0, 1, 0), 0.9, 2000, Carried(1, 200))
    assert free.broken_at == 2 and not free.sent_as_built
    only = solve(ladders, 2000, cache_price=0.9, text_free=400,
                 carried=Carried(1, 200, held=frozenset({2, 3})))  # fmt: skip
    assert only is not None and only.sent_as_built and only.choice == (0, 0, 0, 0)


def test_the_rent_a_kept_batch_pays_now_counts_toward_the_buy() -> None:
    """Keeping the batch, the best choice cuts the last entry and pays its break now (0.9
    of its 300 tokens, 270); sent as built, the request breaks where the growth begins
    (0.9 of 900): 280 worse. That rent counts with the regret in this turn's buy, so a
    regret of 10 buys the settle, 9 does not; without a batch no rent is counted."""
    ladders = _grown_library()
    kept = solve(ladders, 2000, cache_price=0.9, text_free=400, carried=Carried(1, 200), regret=9.0)
    assert kept is not None and kept.choice == (0, 0, 0, 1) and not kept.bought
    assert kept.value - kept.objective == 0.9 * 300
    bought = solve(ladders, 2000, cache_price=0.9, text_free=400, carried=Carried(1, 200),
                   regret=10.0)  # fmt: skip
    assert bought is not None and bought.bought and bought.sent_as_built
    assert bought.choice == (0, 0, 0, 0) and bought.broken_at == 1
    assert bought.objective == 1900.0 - 0.9 * 900 + 10.0 + 0.9 * 300
    free = solve(ladders, 2000, cache_price=0.9, text_free=400, regret=10.0)
    assert free is not None and not free.bought and free.choice == (0, 0, 0, 0)


@st.composite
def _ladders(draw: st.DrawFn) -> tuple[list[Ladder], int, float]:
    n = draw(st.integers(1, 5))
    ladders = []
    for _ in range(n):
        rungs = tuple(
            Rung(t, draw(st.floats(0, 1000)), draw(st.booleans()))
            for t in draw(st.lists(st.integers(0, 500), min_size=1, max_size=4))
        )
        previous = draw(st.one_of(st.none(), st.integers(0, len(rungs) - 1)))
        ladders.append(Ladder(rungs, previous))
    room = draw(st.integers(0, 1500))
    return ladders, room, draw(st.floats(0, 2))


@settings(max_examples=300, deadline=None)
@given(_ladders())
def test_never_over_the_room_and_never_worse_than_last_turn(
    case: tuple[list[Ladder], int, float],
) -> None:
    """Never over the room; when last turn's choice (new units at their smallest) fits,
    the solution's objective is at least that choice's; None only when even the smallest
    rungs do not fit; and the exhaustive optimum is never more than one rung's value
    better (the greedy's bound on a multiple-choice knapsack)."""
    ladders, room, price = case
    done = solve(ladders, room, cache_price=price, text_free=10_000)
    smallest = sum(min(r.tokens for r in ladder.rungs) for ladder in ladders)
    if done is None:
        assert smallest > room
        return
    assert done.tokens <= room
    assert done.tokens == sum(
        ladder.rungs[c].tokens for ladder, c in zip(ladders, done.choice, strict=True)
    )
    _assert_no_worse_than_last_turn(ladders, room, price, done)
    best = max(
        scored(ladders, choice, price, room).objective
        for choice in itertools.product(*(range(len(ladder.rungs)) for ladder in ladders))
        if sum(ladder.rungs[c].tokens for ladder, c in zip(ladders, choice, strict=True)) <= room
    )
    top = max(r.value for ladder in ladders for r in ladder.rungs)
    assert done.objective >= best - top - price * 500 * len(ladders) - 1e-6


@settings(max_examples=300, deadline=None)
@given(_ladders(), st.integers(0, 5), st.integers(1, 1500), st.sets(st.integers(0, 5)))
def test_a_choice_over_what_the_batch_carries_breaks_where_it_grew(
    case: tuple[list[Ladder], int, float], at: int, carried: int, held: set[int]
) -> None:
    """With what the batch carries: never over the room, None only when the smallest
    rungs do not fit it, and a choice over the room less what is carried, or one that
    changes a ladder the batch holds, breaks at the carried ladder at the latest (it is
    sent as built, and says so)."""
    ladders, room, price = case
    at = min(at, len(ladders) - 1)
    prefix = [j for j, ladder in enumerate(ladders) if ladder.previous is not None]
    holds = frozenset(j for j in held if j in prefix and j > at)
    carry = Carried(at, carried, held=holds)
    done = solve(ladders, room, cache_price=price, text_free=10_000, carried=carry)
    if done is None:
        assert sum(min(r.tokens for r in ladder.rungs) for ladder in ladders) > room
        return
    assert done.tokens <= room
    changed = any(done.choice[j] != ladders[j].previous for j in holds)
    if (done.tokens > room - carried or changed) and at in prefix:
        assert done.broken_at is not None and prefix.index(done.broken_at) <= prefix.index(at)
        assert done.sent_as_built


def _assert_no_worse_than_last_turn(
    ladders: list[Ladder], room: int, price: float, done: Solution
) -> None:
    """When last turn's choice (new units at their smallest) fits ``room``, ``done``'s
    objective is at least that choice's."""
    keep = [
        ladder.previous if ladder.previous is not None else _smallest_plain(ladder)
        for ladder in ladders
    ]
    if sum(ladder.rungs[c].tokens for ladder, c in zip(ladders, keep, strict=True)) <= room:
        assert done.objective >= scored(ladders, keep, price, room).objective - 1e-6


def _smallest_plain(ladder: Ladder) -> int:
    """A new ladder's smallest rung, one that changes no earlier block first, then the
    one that changes the latest."""
    rungs = ladder.rungs
    return min(
        range(len(rungs)),
        key=lambda i: (rungs[i].tokens, rungs[i].at is not None, -(rungs[i].at or 0), i),
    )


@st.composite
def _joining(draw: st.DrawFn) -> tuple[list[Ladder], int, float]:
    """Random ladders whose rungs may change an earlier prefix ladder's block (``at``)."""
    ladders, room, price = draw(_ladders())
    places = sum(ladder.previous is not None for ladder in ladders)
    out = []
    for ladder in ladders:
        rungs = tuple(
            attrs.evolve(r, at=draw(st.integers(0, places - 1)), join=draw(st.floats(0, 300)))
            if places and draw(st.booleans())
            else r
            for r in ladder.rungs
        )
        out.append(Ladder(rungs, ladder.previous))
    return out, room, price


@settings(max_examples=300, deadline=None)
@given(_joining())
def test_rungs_joining_an_index_keep_the_solvers_promises(
    case: tuple[list[Ladder], int, float],
) -> None:
    """With rungs that break the prefix at an earlier ladder: never over the room, None
    only when even the smallest rungs do not fit, never worse than last turn's choice when
    it fits, and the same choice for the same ladders."""
    ladders, room, price = case
    done = solve(ladders, room, cache_price=price, text_free=10_000)
    if done is None:
        assert sum(min(r.tokens for r in ladder.rungs) for ladder in ladders) > room
        return
    assert done.tokens <= room
    assert done.objective == scored(ladders, done.choice, price, room).objective
    _assert_no_worse_than_last_turn(ladders, room, price, done)
    assert solve(list(ladders), room, cache_price=price, text_free=10_000) == done


@settings(max_examples=100, deadline=None)
@given(_ladders())
def test_the_same_ladders_give_the_same_choice(case: tuple[list[Ladder], int, float]) -> None:
    ladders, room, price = case
    assert solve(ladders, room, cache_price=price) == solve(list(ladders), room, cache_price=price)


@settings(max_examples=200, deadline=None)
@given(_joining(), st.integers(0, 1500), st.floats(0, 1000))
def test_solves_sharing_their_hull_steps_choose_as_alone(
    case: tuple[list[Ladder], int, float], other: int, regret: float
) -> None:
    """A budget stage's rounds share the ladders' hull steps (``Hulls``): each solve,
    the same ladders in another order and room first, chooses what it chooses alone."""
    ladders, room, price = case
    hulls = Hulls()
    moved = ladders[::-1]
    first = solve(moved, other, cache_price=price, regret=regret, hulls=hulls)
    again = solve(ladders, room, cache_price=price, regret=regret, hulls=hulls)
    assert first == solve(moved, other, cache_price=price, regret=regret)
    assert again == solve(ladders, room, cache_price=price, regret=regret)
    assert hulls.steps or all(any(r.join for r in ladder.rungs) for ladder in ladders)


@settings(max_examples=200, deadline=None)
@given(_ladders(), _ladders(), st.integers(0, 1500), st.data())
def test_a_solve_after_another_sorts_again_only_the_ladders_that_changed(
    case: tuple[list[Ladder], int, float],
    more: tuple[list[Ladder], int, float],
    other: int,
    data: st.DataObject,
) -> None:
    """The next round's solve keeps the last one's sorted steps but those of the ladders
    that changed (``Hulls.last``): the steps are those made afresh (the ladders joining
    an earlier block left out), and it chooses what it chooses alone."""
    ladders, room, price = case
    ladders = ladders + more[0]  # two or more: one may change while the rest stay
    n = len(ladders)
    hulls = Hulls()
    solve(ladders, other, cache_price=price, hulls=hulls)
    j = data.draw(st.integers(0, n - 1))
    old = ladders[j]
    rungs = tuple(attrs.evolve(r, value=r.value * 2 + 1) for r in old.rungs)
    changed = [*ladders[:j], Ladder(rungs, old.previous, old.lasting), *ladders[j + 1 :]]
    assert solve(changed, room, cache_price=price, hulls=hulls) == solve(
        changed, room, cache_price=price
    )
    prices = data.draw(st.lists(st.sampled_from([0.0, price]), min_size=n, max_size=n))
    joined = frozenset(data.draw(st.sets(st.integers(0, n - 1), max_size=n // 2)))
    _sorted_steps(ladders, prices, joined, hulls)
    moved = list(prices)
    moved[data.draw(st.integers(0, n - 1))] = price + 1  # a price changed alone is a change
    fresh = _sorted_steps(changed, moved, joined, None)
    assert _sorted_steps(changed, moved, joined, hulls) == fresh
    assert not any(s.ladder in joined for s in fresh)


@pytest.mark.parametrize(("window", "reserve"), [(6000, 1500), (3000, 400)])
def test_the_objective_policy_fits_a_whole_chat_and_keeps_the_invariants(
    window: int, reserve: int
) -> None:
    """chat30 under the default budget: every request fits, each envelope passes the
    invariants against the one before, and the turns that cut use most of the limit."""
    from lamina import Conversation, load_script, run_script
    from lamina.pipeline import Budget, check_envelope
    from lamina.renderers import judge_chat

    script = load_script(Path(__file__).resolve().parents[2] / "examples" / "chat30.yaml")
    budget = Budget(context_window=window, reserve_output=reserve)
    conv = Conversation(script.system, vault=script.vault, budget=budget)
    envs = run_script(script, conv)
    for previous, env in zip([None, *envs], envs, strict=False):
        check_envelope(env, previous)
        assert env.report.budget is not None and env.report.budget.used <= budget.limit
    judged = judge_chat(envs, conv.counter, budget=budget)
    assert judged.cut_turns > 0 and judged.window_use >= 0.9


@st.composite
def _beside(draw: st.DrawFn) -> tuple[list[_Unit], int]:
    """``_kept``'s units: fixed ones with their present rung only, passages absent/sent."""
    units = []
    for j in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            rung = Rung(draw(st.integers(0, 300)), draw(st.floats(0, 100)), draw(st.booleans()))
            units.append(_Unit("history", f"u{j}", Ladder((rung,), 0), (_Choice("text"),)))
        else:
            tokens = draw(st.integers(1, 300))
            value = draw(st.sampled_from([0.0, 1.0, 2.5])) * tokens  # ties in value per token
            ladder = Ladder((Rung(0, 0.0), Rung(tokens, value)))
            units.append(_Unit("passage", f"p{j}", ladder, (_Choice("absent"), _Choice("x"))))
    return units, draw(st.integers(0, 1500))


@settings(max_examples=300, deadline=None)
@given(_beside(), st.floats(0, 2), st.integers(0, 400))
def test_passages_beside_a_kept_request_are_the_solves_choice(
    case: tuple[list[_Unit], int], price: float, text_free: int
) -> None:
    """``_kept``'s first fit of the passages is exactly what ``solve`` chooses."""
    units, room = case
    assert _plain_passages(units)
    done = solve([u.ladder for u in units], room, cache_price=price, text_free=text_free)
    assert _passages_beside(units, room) == (None if done is None else done.choice)


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.integers(0, 50), st.floats(allow_nan=True)),
    st.tuples(st.integers(0, 50), st.floats(allow_nan=True)),
    st.floats(0, 2),
)
def test_a_two_rung_ladders_hull_and_smallest_are_the_general_ones(
    a: tuple[int, float], b: tuple[int, float], price: float
) -> None:
    """The two-rung shortcuts order rungs exactly as the general sort and ``min`` do."""
    from lamina.pipeline._budget import solver

    rungs = (Rung(*a), Rung(*b))
    order = sorted(range(2), key=lambda i: (rungs[i].tokens, -rungs[i].value, i))
    assert solver._smallest(rungs) == min(
        range(2), key=lambda i: (rungs[i].tokens, -rungs[i].value, i)
    )
    first, second = rungs[order[0]], rungs[order[1]]
    keep = second.tokens != first.tokens and not (
        second.value - price * second.tokens <= first.value - price * first.tokens
    )
    assert solver._hull(rungs, price) == (order if keep else order[:1])


def test_a_made_preview_that_extends_the_batch_is_scored_as_an_extension() -> None:
    """``_as_made`` fits the choice into the room less what the batch carries and scores
    it against the solve's room (``scored`` takes the carried tokens off itself): before,
    it took them off twice, so an extension filling its room was scored as sent as built,
    its prefix broken where the batch began."""
    from lamina.pipeline._budget.objective import _as_made

    units = [
        _Unit("library", "e", Ladder((Rung(100, 100.0),), 0), (_Choice("full"),)),
        _Unit("item", "i", Ladder((Rung(10, 5.0), Rung(300, 200.0))), (_Choice("i"), _Choice("f"))),
    ]
    carried = Carried(0, 100)
    solution = Solution((0, 1), 400, 300.0, None, 300.0)
    made = _as_made(units, units, solution, 500, 0.9, carried, 0)
    assert made is not None and made.tokens == 400
    assert not made.sent_as_built and made.broken_at is None and made.objective == 300.0


def test_a_break_that_keeps_the_batch_adds_its_price_to_the_regret() -> None:
    """``_regret``: a break paid while the batch extends is the batch's rent and counts
    with the value forgone, so the regret buys the settle once the breaks cost what it
    does; not while no batch is carried, nor for a request sent as built; the turn after
    a settle (the batch's messages hold that turn alone) starts over."""
    from types import SimpleNamespace

    from lamina.pipeline._budget.objective import _regret

    units = [_Unit("library", "e", Ladder((Rung(100, 100.0), Rung(20, 30.0)), 0), ())]
    cut = Solution((1,), 20, 30.0, 0, -60.0, free_value=100.0)  # 90 of cache lost, 70 forgone
    batch = SimpleNamespace(regret=50.0, deferred=((3, 10), (4, 10)))
    assert _regret(batch, units, cut, (1,), extending=True) == 50.0 + 90.0 + 70.0
    assert _regret(batch, units, cut, (1,), extending=False) == 50.0 + 70.0
    built = attrs.evolve(cut, sent_as_built=True)
    assert _regret(batch, units, built, (1,), extending=True) == 50.0 + 70.0
    settled = SimpleNamespace(regret=50.0, deferred=((4, 10),))
    assert _regret(settled, units, cut, (1,), extending=True) == 90.0 + 70.0


def test_the_least_growth_is_the_smallest_step_up_from_the_choice() -> None:
    """``_least_growth``: the fewest tokens any unit's chosen form grows by to a larger
    rung of its ladder (rungs in any order); none larger anywhere: no growth at all."""
    from lamina.pipeline._budget.objective import _least_growth

    units = [
        _Unit("item", "a", Ladder((Rung(300, 9.0), Rung(40, 3.0), Rung(90, 5.0))), ()),
        _Unit("item", "b", Ladder((Rung(20, 1.0), Rung(75, 4.0))), ()),
        _Unit("library", "c", Ladder((Rung(100, 8.0),), 0), ()),
    ]
    assert _least_growth(units, (1, 1, 0)) == 50  # a: 40 -> 90; b stands at its largest
    assert _least_growth(units, (2, 0, 0)) == 55  # b: 20 -> 75, a: 90 -> 300 is more
    assert _least_growth(units, (0, 1, 0)) == sys.maxsize


@pytest.mark.parametrize(
    ("free", "growth", "expected"),
    [
        (0, 1, None),  # the fit left nothing
        (3, 4, None),  # no form grows into 3 tokens: the rounds end
        (4, 4, -14),  # the room grows by what the fit left
        (30, 4, -22),  # -30 measured too much before: halfway between
    ],
)
def test_refining_rounds_end_where_no_form_grows_into_what_is_left(
    free: int, growth: int, expected: int | None
) -> None:
    """``_next_short`` between the best fit (solved with short -10) and a short that
    measured too much (-34). A fit at 200k that left 3 tokens free took three more rounds
    (a solve, an apply and a draft each, about 40 ms) that gained at most 6 tokens."""
    from lamina.pipeline._budget.objective import _next_short

    assert _next_short(-10, -34, free, growth) == expected


def test_a_change_after_a_stale_block_of_the_batch_breaks_at_that_block() -> None:
    """``_shed_from_stale``: an entry the batch sheds from, standing after the first block
    the library holds otherwise than the batch sent it (``TurnGraph.stale``), breaks the
    prefix at that block when it changes: its rungs but last turn's carry that place
    (``Rung.at``), so the solve prices the shed as sent. Entries before it, entries the
    batch does not shed from and history are as they were; so is everything without a
    stale block."""
    from types import SimpleNamespace

    from lamina.pipeline._budget.objective import _shed_from_stale

    def unit(kind: str, key: str, previous: int | None = 0) -> _Unit:
        return _Unit(kind, key, Ladder((Rung(80, 8.0), Rung(120, 9.0)), previous), ())

    units = [
        unit("library", "a"), unit("library", "b"), unit("library", "c"),
        unit("library", "d"), unit("history", "h"), unit("item", "i", None),
    ]  # fmt: skip
    turn = SimpleNamespace(stale="b", sheds=("b", "c"))
    out = _shed_from_stale(turn, units)  # type: ignore[arg-type]
    assert [r.at for r in out[2].ladder.rungs] == [None, 1]  # c: breaks at b's place
    assert out[0] == units[0] and out[1] == units[1]  # a, and b itself: their own places
    assert out[3] == units[3]  # d: not shed from (a change settles the batch)
    assert out[4:] == units[4:]
    assert _shed_from_stale(SimpleNamespace(stale="", sheds=("c",)), units) == units  # type: ignore[arg-type]
