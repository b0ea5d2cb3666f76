"""The cut cascade's parts (being removed: the budget's objective replaces them)."""

from lamina.pipeline._budget.fit import (
    CUT_POLICIES,
    DEFAULT_ORDER,
    PREFIX_FIRST_ORDER,
    Cut,
    Enforce,
    compact_l1_mutable,
    compact_l2,
    compact_l3,
    drop_history,
    excerpt_non_recoverable,
    shorten_replies,
)
from lamina.pipeline._budget.settings import BudgetPlan

__all__ = [
    "CUT_POLICIES",
    "DEFAULT_ORDER",
    "PREFIX_FIRST_ORDER",
    "BudgetPlan",
    "Cut",
    "Enforce",
    "compact_l1_mutable",
    "compact_l2",
    "compact_l3",
    "drop_history",
    "excerpt_non_recoverable",
    "shorten_replies",
]
