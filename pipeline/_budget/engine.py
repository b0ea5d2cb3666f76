"""The one fitting engine: while a request is over its budget, take the first plan of an
order that still cuts, keep the running count, record every cut as a decision.

The turn's budget stage (``fit.Enforce``: library entries, history, this turn's items,
L1's mutable part) and the agent loop (``AgentTurn.fit``: old tool results, then the
largest) are both orders of plans over a state that knows its own exact count; the
engine owns the loop, the savings of each cut and the report, or ``BudgetExceeded``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import attrs

from pipeline._errors import BudgetExceeded
from pipeline._model.envelope import BudgetReport, Decision

if TYPE_CHECKING:
    from pipeline._budget.fit import Budget

__all__ = ["Measured", "Plan", "fit"]

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
    while (over := budget.effective(state.used) - budget.limit) > 0:
        for plan in plans:
            step = plan(state, over)
            if step is not None:
                break
        else:
            report = budget.report(state.used, before, state.layer_tokens(), decisions)
            raise BudgetExceeded(too_big(state, len(decisions)), report)
        new, made = step
        if len(made) == 1:
            made = [attrs.evolve(made[0], tokens_saved=state.used - new.used)]
        decisions.extend(made)
        state = new
    return state, budget.report(state.used, before, state.layer_tokens(), decisions)
