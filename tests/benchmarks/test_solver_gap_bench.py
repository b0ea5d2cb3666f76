"""``benchmarks/solver_gap.py``: its exact baseline, and the run on the repository's vault."""

from __future__ import annotations

from benchmarks.solver_gap import KEPANO, Recorded, exact_choice, gap_rows
from lamina.pipeline._budget.solver import Ladder, Rung, scored, solve


def test_the_exact_choice_finds_what_the_greedy_misses() -> None:
    """Two new units in 523 tokens: the greedy climbs the first ladder's steep step
    (28 -> 110 tokens), then the second's step to 477 no longer fits (314 in all); the
    exact choice keeps the first small and the second at 492 (578)."""
    first = Ladder((Rung(28, 96.0), Rung(44, 60.0), Rung(110, 191.0)))
    second = Ladder((Rung(32, 123.0), Rung(477, 474.0), Rung(490, 481.0), Rung(492, 482.0)))
    ladders = (first, second)
    done = solve(ladders, 523)
    assert done is not None and done.choice == (2, 0) and done.objective == 314.0
    recorded = Recorded(ladders, 523, 0.0, 10_000, 0.0, None, done)
    choice = exact_choice(recorded)
    assert choice == (0, 3) and scored(ladders, choice, 0.0, 523).objective == 578.0


def test_the_greedy_never_beats_its_exact_baseline_on_a_real_chat() -> None:
    """The kepano vault's chats at 4k: every solve compared (the exact choice keeps the
    greedy's break and scores each ladder as the objective does), none where the greedy
    scores higher than the exact choice, the gaps between 0 and 1."""
    rows = gap_rows(KEPANO, (4096,))
    assert [(r["chat"], r["window"]) for r in rows] == [("mixed", 4096), ("shifted", 4096)]
    for row in rows:
        assert 0 < row["compared"] <= row["solves"]
        assert row["greedy_better_0_1pct"] == 0
        assert 0.0 <= row["mean_gap"] <= row["max_gap"] < 1.0
