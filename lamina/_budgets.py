"""The one rule that turns a window, a reserve, a model, the recall switch and the
objective's settings into a ``Budget``: the CLI's flags, the server's conversation
settings and replay configs all read it, so the default reserve is the same everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lamina.pipeline import Budget, BudgetSettings
from lamina.pipeline.errors import ConfigError

__all__ = ["OBJECTIVE_FIELDS", "NeedsWindow", "budget_of", "objective_of"]


class NeedsWindow(ConfigError):
    """A budget setting (``reserve``, ``recall``) given with neither a window nor a model."""

    def __init__(self, setting: str) -> None:
        super().__init__(setting, "needs a window or a model")


OBJECTIVE_FIELDS = ("headroom", "cache_weight", "text_free_share", "source_weights")
"""The budget objective's settings a CLI config or the server may set (``BudgetSettings``)."""


def objective_of(values: object, where: str = "objective") -> dict[str, Any]:
    """The objective's settings from a mapping of some of ``OBJECTIVE_FIELDS`` (the others
    keep their defaults), each checked by ``BudgetSettings``' own validators. An unknown
    key or a bad value is a ``ConfigError`` naming ``where.<field>``."""
    if not isinstance(values, Mapping):
        raise ConfigError(where, f"must be a mapping, got {type(values).__name__}")
    for key in sorted(values, key=str):
        if key not in OBJECTIVE_FIELDS:
            raise ConfigError(
                f"{where}.{key}", f"unknown key (known: {', '.join(OBJECTIVE_FIELDS)})"
            )
    given = dict(values)
    try:
        BudgetSettings(context_window=2, reserve_output=0, **given)
    except ConfigError as exc:  # the validators name budget.<field>
        field = exc.setting.rpartition(".")[2]
        raise ConfigError(f"{where}.{field}", str(exc).removeprefix(f"{exc.setting}: ")) from None
    except (TypeError, ValueError) as exc:  # source_weights that are not name: weight pairs
        raise ConfigError(
            f"{where}.source_weights", f"must map source types to weights ({exc})"
        ) from None
    return given


def budget_of(
    window: int | None,
    reserve: int | None = None,
    model: str | None = None,
    recall: bool | None = None,
    objective: Mapping[str, Any] | None = None,
) -> Budget | None:
    """The model's profile and/or the window, with the reserve (by default 4,096 tokens
    for the reply, or a quarter of a small window), recall on or off and the objective's
    settings given (``objective_of``); None when neither a window nor a model is given."""
    overrides: dict[str, Any] = {}
    if objective is not None:
        overrides.update(objective_of(objective))
    if window is not None:
        overrides["context_window"] = window
    if reserve is not None:
        overrides["reserve_output"] = reserve
    if recall is not None:
        overrides["recall"] = recall
    if model is not None:
        return Budget.for_model(model, **overrides)
    if window is None:
        for setting, value in (("reserve", reserve), ("recall", recall), ("objective", objective)):
            if value is not None:
                raise NeedsWindow(setting)
        return None
    return Budget(**overrides)  # the reserve by ``BudgetSettings``' default unless given
