"""The one rule that turns a window, a reserve, a model, a recall share and a budget
plan into a ``Budget``: the CLI's flags, the server's conversation settings and replay
configs all read it, so the default reserve is the same everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from lamina.pipeline import Budget
from lamina.pipeline.budget import BudgetPlan
from lamina.pipeline.errors import ConfigError

__all__ = ["NeedsWindow", "budget_of", "plan_of"]


class NeedsWindow(ConfigError):
    """A budget setting (``reserve``, ``recall``) given with neither a window nor a model."""

    def __init__(self, setting: str) -> None:
        super().__init__(setting, "needs a window or a model")


def plan_of(values: object, where: str = "plan") -> BudgetPlan:
    """A ``BudgetPlan`` from a mapping of some of its fields (the others keep their
    defaults), read over ``attrs.fields(BudgetPlan)`` so a field added or renamed there
    is taken here as it is. An unknown key or a bad value is a ``ConfigError`` naming
    ``where.<field>``; a whole number is taken for a fractional field."""
    if not isinstance(values, Mapping):
        raise ConfigError(where, f"must be a mapping, got {type(values).__name__}")
    fields = {f.name: f for f in attrs.fields(attrs.resolve_types(BudgetPlan))}
    for key in sorted(values, key=str):
        if key not in fields:
            known = ", ".join(fields)
            raise ConfigError(f"{where}.{key}", f"unknown key (known: {known})")
    given: dict[str, Any] = {
        key: float(value)
        if fields[key].type is float and type(value) is int
        else value
        for key, value in values.items()
    }
    try:
        return BudgetPlan(**given)
    except ConfigError as exc:  # the validators name budget.plan.<field>
        field = exc.setting.rpartition(".")[2]
        raise ConfigError(
            f"{where}.{field}", str(exc).removeprefix(f"{exc.setting}: ")
        ) from None
    except TypeError as exc:  # a field without a default, not given
        raise ConfigError(where, str(exc)) from None


def budget_of(
    window: int | None,
    reserve: int | None = None,
    model: str | None = None,
    recall: float | None = None,
    plan: Mapping[str, Any] | BudgetPlan | None = None,
) -> Budget | None:
    """The model's profile and/or the window, with the reserve (by default 4,096 tokens
    for the reply, or a quarter of a small window), recall's share and the budget plan's
    fields given (``plan_of``); None when neither a window nor a model is given."""
    overrides: dict[str, Any] = {}
    if plan is not None:
        overrides["plan"] = plan if isinstance(plan, BudgetPlan) else plan_of(plan)
    if window is not None:
        overrides["context_window"] = window
    if reserve is not None:
        overrides["reserve_output"] = reserve
    if recall is not None:
        overrides["recall_share"] = recall
    if model is not None:
        return Budget.for_model(model, **overrides)
    if window is None:
        for setting, value in (("reserve", reserve), ("recall", recall), ("plan", plan)):
            if value is not None:
                raise NeedsWindow(setting)
        return None
    return Budget(**overrides)  # the reserve by ``BudgetSettings``' default unless given
