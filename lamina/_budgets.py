"""The one rule that turns a window, a reserve, a model and a recall share into a
``Budget``: the CLI's flags, the server's conversation settings and replay configs all
read it, so the default reserve is the same everywhere."""

from __future__ import annotations

from typing import Any

from pipeline import Budget, ConfigError

__all__ = ["NeedsWindow", "budget_of"]


class NeedsWindow(ConfigError):
    """A budget setting (``reserve``, ``recall``) given with neither a window nor a model."""

    def __init__(self, setting: str) -> None:
        super().__init__(setting, "needs a window or a model")


def budget_of(
    window: int | None,
    reserve: int | None = None,
    model: str | None = None,
    recall: float | None = None,
) -> Budget | None:
    """The model's profile and/or the window, with the reserve (by default 4,096 tokens
    for the reply, or a quarter of a small window) and recall's share; None when neither
    a window nor a model is given."""
    overrides: dict[str, Any] = {}
    if window is not None:
        overrides["context_window"] = window
    if reserve is not None:
        overrides["reserve_output"] = reserve
    if recall is not None:
        overrides["recall_share"] = recall
    if model is not None:
        return Budget.for_model(model, **overrides)
    if window is None:
        for setting, value in (("reserve", reserve), ("recall", recall)):
            if value is not None:
                raise NeedsWindow(setting)
        return None
    overrides.setdefault("reserve_output", min(4096, window // 4))
    return Budget(**overrides)
