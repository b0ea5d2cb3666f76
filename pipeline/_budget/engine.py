"""The agent loop's fitting engine: while a request is over its budget, take the first
plan of an order that still cuts, keep the running count, record every cut as a decision.

The agent loop (``AgentTurn.fit``: old tool results, then the largest) is an order of
plans over a state that knows its own exact count; the engine owns the loop, the savings
of each cut and the report, or ``BudgetExceeded``. (A turn's budget stage is not a cut
order: it is one solve over ladders of forms, ``objective.Solve``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import attrs

from lamina.pipeline._errors import BudgetExceeded, StageError
from lamina.pipeline._model.envelope import BudgetReport, Decision

if TYPE_CHECKING:
    from lamina.pipeline._turn.budget import Budget

__all__ = ["MAX_IDLE_ROUNDS", "Measured", "Plan", "fit"]

MAX_IDLE_ROUNDS = 1000
"""Rounds in a row that save no token before the engine stops: a plan that keeps cutting
without saving (a custom cut, or a bug) raises instead of looping for ever."""

S = TypeVar("S", bound="Measured")


class Measured(Protocol):
    """A state the engine fits: it carries its request's exact tokens (``used``) and its
    per-layer counts (``layer_tokens``) for the report."""

    @property
    def used(self) -> int: ...

    def layer_tokens(self) -> tuple[tuple[str, int], ...]: ...


Plan = Callable[[S, int], "tuple[S, Sequence[Decision]] | None"]
"""One plan: given the state and its excess (tokens over the limit), the next state and
the decisions that made it, or None when it has nothing left to cut."""


def fit(
    state: S,
    plans: Sequence[Plan[S]],
    budget: Budget,
    too_big: Callable[[S, int], str],
    before: tuple[tuple[str, int], ...] | None = None,
) -> tuple[S, BudgetReport]:
    """Cut ``state`` until it fits ``budget``: each round, the first plan (in order) that
    still cuts. A round of one decision records what it saved as measured; a plan that
    makes several records each decision's own estimate. When no plan cuts, raises
    ``BudgetExceeded`` with ``too_big(state, cuts so far)`` and the report (``before``:
    the layers before any cut, the state's own by default)."""
    if before is None:
        before = state.layer_tokens()
    decisions: list[Decision] = []
    idle = 0
    while (over := budget.effective(state.used) - budget.limit) > 0:
        for plan in plans:
            step = plan(state, over)
            if step is not None:
                break
        else:
            report = budget.report(state.used, before, state.layer_tokens(), decisions)
            raise BudgetExceeded(too_big(state, len(decisions)), report)
        new, made = step
        idle = idle + 1 if new.used >= state.used else 0
        if idle > MAX_IDLE_ROUNDS:
            name = getattr(plan, "__qualname__", repr(plan))
            raise StageError(
                "budget",
                f"{MAX_IDLE_ROUNDS} cuts in a row saved no token (the last by {name}: "
                f"{', '.join(d.reason for d in made) or 'no decision'}); {over} tokens over",
            )
        if len(made) == 1:
            made = [attrs.evolve(made[0], tokens_saved=state.used - new.used)]
        decisions.extend(made)
        state = new
    return state, budget.report(state.used, before, state.layer_tokens(), decisions)
