"""A budget's plain settings: the one record of its numbers, kept by stores.

``Budget`` extends it with the cut order (callables, which a store cannot keep), so every
field is declared and validated once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._input import validate as _validate
from lamina.pipeline._tokens.profiles import OPENAI_FRAMING

if TYPE_CHECKING:
    from lamina.pipeline._budget.fit import Budget

__all__ = ["RECALL_SHARE", "BudgetPlan", "BudgetSettings"]

RECALL_SHARE = 0.0
"""The default ``recall_share``: off. With it on (0.9 measured) chat30's cached share at
6,000 fell from 72.8% to 65.1% and a cache figure passed its request (docs/BUDGET.md)."""


def _at_least(minimum: int) -> Callable[[object, attrs.Attribute[int], object], None]:
    """An attrs validator: an int (not a bool or a string) of at least ``minimum``."""

    def check(_: object, attribute: attrs.Attribute[int], value: object) -> None:
        _validate.integer(f"budget.{attribute.name}", value, minimum=minimum)

    return check


def _real(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    _validate.number(f"budget.{attribute.name}", value)


def _fraction(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    """An attrs validator: a number in [0, 1)."""
    share = _validate.number(f"budget.{attribute.name}", value)
    if not 0.0 <= share < 1.0:
        raise ConfigError(f"budget.{attribute.name}", f"must be in [0, 1), got {value!r}")


def _share(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    """An attrs validator: a number in [0, 1) (a share of the budget's limit)."""
    share = _validate.number(f"budget.plan.{attribute.name}", value)
    if not 0.0 <= share < 1.0:
        raise ConfigError(f"budget.plan.{attribute.name}", f"must be in [0, 1), got {value!r}")


def _count(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    _validate.integer(f"budget.plan.{attribute.name}", value, minimum=0)


def _flag(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"budget.plan.{attribute.name}", f"must be True or False, got {value!r}")


def _weights(value: object) -> tuple[tuple[str, float], ...]:
    """Source weights as sorted (source, weight) pairs, from a mapping or pairs."""
    pairs = dict(value)  # type: ignore[call-overload]
    return tuple(sorted((str(k), float(w)) for k, w in pairs.items()))


def _plan(_: object, attribute: attrs.Attribute[BudgetPlan], value: object) -> None:
    if not isinstance(value, BudgetPlan):
        raise ConfigError("budget.plan", f"must be a BudgetPlan, got {type(value).__name__}")


@attrs.frozen
class BudgetPlan:
    """How the budget shares the window between the library, history and this turn's
    items, and when it gives cut library entries back their fuller forms.

    The library keeps ``library_floor`` of the limit (or all it holds, if less) and history
    its last ``history_turns`` turns while this turn's items are cut to previews; only if
    those items could otherwise not be seen at all (collapsed into an index or not sent)
    do the floors give way. A cut frees a slack beyond the excess when it needs no deeper
    form for it (so the next turns grow without cutting again): what the last
    ``slack_turns`` turns added to history (their mean stands for turns a younger
    conversation does not have yet), at most ``slack`` of the limit (``slack`` of the
    limit before the first reply, or with ``slack_turns=0``); a cut made only for
    items this turn sends again beside their library forms keeps none, since the next
    turn has their room back. A restore leaves the slack free after it and is made only
    when it gives back at least ``restore_min`` of the limit, or where the prefix breaks
    anyway (an L1 change, a refresh, or this turn's own cut, after which the library is
    filled again up to the slack), since it breaks the cached prefix from the first
    entry it restores. While a conversation batches its requests (the default layout),
    a cut library entry whose whole form fits what the request leaves free beyond the
    slack is also sent whole again in the user message at once (``restore_append``): the
    system message keeps the cut form until the prefix breaks, so this costs no break.
    ``restore=False`` keeps every cut for good (the behaviour before cuts were
    reversible)."""

    library_floor: float = attrs.field(default=0.25, validator=_share)
    history_turns: int = attrs.field(default=2, validator=_count)
    slack: float = attrs.field(default=0.2, validator=_share)
    slack_turns: int = attrs.field(default=4, validator=_count)
    restore_min: float = attrs.field(default=0.4, validator=_share)
    restore: bool = attrs.field(default=True, validator=_flag)
    restore_append: bool = attrs.field(default=True, validator=_flag)

    def fields(self) -> tuple[tuple[str, str], ...]:
        """The plan as (name, value) pairs for reports and traces."""
        return tuple((f.name, str(getattr(self, f.name))) for f in attrs.fields(BudgetPlan))


def _default_plan() -> BudgetPlan:
    return BudgetPlan()


def _default_reserve(settings: BudgetSettings) -> int:
    """The reply's reserve when none is given: 4,096 tokens, or a quarter of a window
    under 16,384 (so any window has room for a request). The CLI, the server and replay
    configs leave it to this default. A window that is no int is left to its validator."""
    window = settings.context_window
    if isinstance(window, int) and not isinstance(window, bool):
        return min(4096, window // 4)
    return 4096


@attrs.frozen
class BudgetSettings:
    """A budget's window, reserve, framing, margins and policy name: every field of a
    ``Budget`` but its cut order, so a store can keep it."""

    context_window: int = attrs.field(validator=_at_least(1))
    reserve_output: int = attrs.field(
        default=attrs.Factory(_default_reserve, takes_self=True), validator=_at_least(0)
    )
    """Tokens kept free for the reply; by default 4,096, or a quarter of a window under
    16,384."""
    per_message_tokens: int = attrs.field(
        default=OPENAI_FRAMING.per_message, validator=_at_least(0)
    )
    priming_tokens: int = attrs.field(default=OPENAI_FRAMING.priming, validator=_at_least(0))
    safety_margin: float = attrs.field(default=0.0, validator=_real)
    history_step: int = attrs.field(default=4, validator=_at_least(1))
    reply_tokens: int = attrs.field(default=400, validator=_at_least(1))
    summary_tokens: int = attrs.field(default=256, validator=_at_least(1))
    policy: str = "current-first"
    tokenizer: str | None = None
    """The profile's tokenizer (``for_model``); a ``Conversation`` without ``tokenizer=``
    counts with it, so an open model's budget is counted with its own encoding."""
    content_lead: str = OPENAI_FRAMING.lead
    trim_content: bool = OPENAI_FRAMING.trim
    chat_template: str = OPENAI_FRAMING.template
    """Where the chat template puts the system text (``CHAT_TEMPLATES``): "mistral" for
    Mistral's instruct format, which sends it inside the last user message."""
    tool_call_tokens: int = attrs.field(default=OPENAI_FRAMING.tool_call, validator=_at_least(0))
    default_system: str | None = OPENAI_FRAMING.default_system
    """What the chat template sends as the system message when the request has none
    (Qwen2.5's default prompt; "" for Llama 3.1's date header); None: nothing."""
    recall_share: float = attrs.field(default=RECALL_SHARE, validator=_fraction)
    """The most of the limit that recalled passages (dropped history, cut library entries
    the query matches) may take; within it the ``recall`` stage's objective decides how
    much, for each query. 0 turns recall off (no index): stores read a budget saved
    without this field with 0, so a stored conversation keeps what it was made with."""
    stub_share: float = attrs.field(default=0.1, validator=_fraction)
    """The share of the window that library stubs and their indexes may take; past it the
    oldest folder's or source's stubs collapse into one index block (``stubs``)."""
    headroom: float = attrs.field(default=0.05, validator=_fraction)
    """The share of the limit a turn that changes forms leaves free, so the next turns'
    queries and replies fit without changing them again (the objective policy)."""
    cache_weight: float = attrs.field(default=0.3, validator=_real)
    """What a token read from the provider's cache is worth, against a token of text the
    model can use: the price a change pays for each token after it (the objective)."""
    text_free_share: float = attrs.field(default=0.1, validator=_fraction)
    """The share of the window that forms without prose (index lines, stubs) may take
    where the objective has a choice."""
    source_weights: tuple[tuple[str, float], ...] = attrs.field(default=(), converter=_weights)
    """Weights of units by source type (``note``, ``file``, ``history``, ...; 1 unless
    set): what the objective values a form of that source at."""

    def source_weight(self, source: str) -> float:
        """The weight of ``source`` (``source_weights``; 1 unless set)."""
        for name, weight in self.source_weights:
            if name == source:
                return weight
        return 1.0

    plan: BudgetPlan = attrs.field(factory=_default_plan, validator=_plan)
    """The shares, floors and restore schedule of the current-first policy."""

    @classmethod
    def of(cls, budget: BudgetSettings) -> BudgetSettings:
        """The settings of ``budget`` (a ``Budget``) without its cut order."""
        return cls(**{f.name: getattr(budget, f.name) for f in attrs.fields(BudgetSettings)})

    def budget(self) -> Budget:
        """The ``Budget`` with these numbers and its policy's cut order (validated)."""
        from lamina.pipeline._budget.fit import Budget

        return Budget(**{f.name: getattr(self, f.name) for f in attrs.fields(BudgetSettings)})
