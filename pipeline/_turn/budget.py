"""A model's budget: its window, reserve, framing and the objective's few settings.

``BudgetSettings`` is the plain record a store keeps; ``Budget`` adds what is computed
from it (the limit, the framing, the exact count of a request). Data below the budget
stage (``lamina.pipeline._budget``) that uses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._input import validate as _validate
from lamina.pipeline._model.envelope import BudgetReport, Decision, Envelope
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._tokens.profiles import (
    CACHE_READ,
    CHAT_TEMPLATES,
    OPENAI_FRAMING,
    Framing,
    framing_of,
    get_profile,
)
from lamina.pipeline._turn.draft import Draft
from lamina.pipeline._turn.measure import request_tokens

__all__ = ["Budget", "BudgetSettings"]


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


def _switch(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"budget.{attribute.name}", f"must be True or False, got {value!r}")


def _weights(value: object) -> tuple[tuple[str, float], ...]:
    """Source weights as sorted (source, weight) pairs, from a mapping or pairs."""
    pairs = dict(value)  # type: ignore[call-overload]
    return tuple(sorted((str(k), float(w)) for k, w in pairs.items()))


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
    """A budget's window, reserve, framing, margins and the objective's settings: the
    record a store keeps of a ``Budget``."""

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
    recall: bool = attrs.field(default=True, validator=_switch)
    """Whether earlier messages are findable: each one the recent suffix of history does
    not show is a passage the budget's solve may send for this query, beside the suffix
    (docs/BUDGET.md, "Memory"). Stores read a budget saved without this field as off (and
    one saved with the old ``recall_share`` as on where that was above 0), so a stored
    conversation keeps what it was made with."""
    headroom: float = attrs.field(default=0.05, validator=_fraction)
    """The least share of the limit a turn that changes forms leaves free (more when the
    last turn added more to history), so the next turn's query and reply fit without
    changing them again."""
    cache_weight: float = attrs.field(default=1.0 - CACHE_READ, validator=_real)
    """What a token read from the provider's cache is worth against a token of text the
    model can use: the price a change pays for each token of the cache it loses (the
    objective). What a token sent again costs beyond reading it from the provider's cache,
    ``ModelProfile.cache_write - cache_read`` in shares of the input price (``for_model``
    sets it: 0.5 for GPT-4o, 0.75 for GPT-4.1, o3 and o4, 0.9 for Gemini and GPT-5, 1.15
    for Claude, whose cache writes cost 1.25x); 0.9 without a model, the current models'
    discount. The lower it is, the sooner a note a turn attaches for its question takes
    room from older entries' cache; 0 sends the most text whatever the cache
    (docs/BUDGET.md)."""
    text_free_share: float = attrs.field(default=0.1, validator=_fraction)
    """The share of the window that forms without prose (index lines, stubs, counts) may
    take, the smallest forms too as far as the room allows."""
    source_weights: tuple[tuple[str, float], ...] = attrs.field(default=(), converter=_weights)
    """Weights of units by source type (``note``, ``file``, ``history``, ...; 1 unless
    set): what the objective values a form of that source at."""

    def source_weight(self, source: str) -> float:
        """The weight of ``source`` (``source_weights``; 1 unless set)."""
        for name, weight in self.source_weights:
            if name == source:
                return weight
        return 1.0

    @classmethod
    def of(cls, budget: BudgetSettings) -> BudgetSettings:
        """The settings of ``budget`` (a ``Budget``): the record a store keeps."""
        return cls(**{f.name: getattr(budget, f.name) for f in attrs.fields(BudgetSettings)})

    def budget(self) -> Budget:
        """The ``Budget`` with these numbers (validated)."""
        return Budget(**{f.name: getattr(self, f.name) for f in attrs.fields(BudgetSettings)})


@attrs.frozen
class Budget(BudgetSettings):
    """The whole-payload budget of one model: window, reserved output, framing, objective.

    Counts are exact (tiktoken). Where a profile says the provider's tokenizer is not
    available locally, counts are scaled by ``1 + safety_margin`` before comparing.
    """

    def __attrs_post_init__(self) -> None:
        if self.chat_template not in CHAT_TEMPLATES:
            raise ConfigError(
                "budget.chat_template",
                f"must be one of {', '.join(CHAT_TEMPLATES)}, got {self.chat_template!r}",
            )
        if not 0 <= self.reserve_output < self.context_window:
            raise ConfigError(
                "budget.reserve_output",
                f"must be >= 0 and below the window ({self.context_window}), "
                f"got {self.reserve_output}",
            )
        if not 0.0 <= self.safety_margin < 1.0:
            raise ConfigError(
                "budget.safety_margin", f"must be in [0, 1), got {self.safety_margin}"
            )

    @classmethod
    def for_model(cls, name: str, **overrides: object) -> Budget:
        """The budget of a model profile (``get_profile``); keyword arguments override."""
        if not isinstance(name, str):
            raise ConfigError("model", f"must be a model name (str), got {type(name).__name__}")
        unknown = sorted(set(overrides) - {f.name for f in attrs.fields(cls)})
        if unknown:
            raise ConfigError(
                "budget",
                f"unknown setting(s) {', '.join(unknown)} "
                f"(known: {', '.join(f.name for f in attrs.fields(cls))})",
            )
        profile = get_profile(name)
        fields: dict[str, object] = {
            "context_window": profile.context_window,
            "reserve_output": profile.default_output_reserve,
            "per_message_tokens": profile.per_message_tokens,
            "priming_tokens": profile.priming_tokens,
            "safety_margin": 0.0 if profile.exact_tokens else profile.safety_margin,
            "tokenizer": profile.tokenizer,
            "content_lead": profile.content_lead,
            "trim_content": profile.trim_content,
            "chat_template": profile.chat_template,
            "tool_call_tokens": profile.tool_call_tokens,
            "default_system": profile.default_system,
            "cache_weight": profile.cache_write - profile.cache_read,
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    @property
    def limit(self) -> int:
        """The most request tokens (as counted locally) that may be sent."""
        return math.floor((self.context_window - self.reserve_output) / (1.0 + self.safety_margin))

    def effective(self, tokens: int) -> int:
        return math.ceil(tokens * (1.0 + self.safety_margin))

    def report(
        self,
        used: int,
        before: tuple[tuple[str, int], ...],
        after: tuple[tuple[str, int], ...],
        decisions: Sequence[Decision],
    ) -> BudgetReport:
        """The report of a fit: this budget's window and limit, the use, and the cuts."""
        return BudgetReport(
            window=self.context_window,
            reserve_output=self.reserve_output,
            limit=self.limit,
            used=used,
            effective=self.effective(used),
            before=before,
            after=after,
            decisions=tuple(decisions),
            plan=(
                ("headroom", str(self.headroom)),
                ("cache_weight", str(self.cache_weight)),
                ("text_free_share", str(self.text_free_share)),
                ("headroom_tokens", str(self.headroom_tokens)),
            ),
        )

    @property
    def headroom_tokens(self) -> int:
        """The room a turn that changes forms leaves free: ``headroom`` of the limit."""
        return math.floor(self.limit * self.headroom)

    @property
    def framing(self) -> Framing:
        """The chat framing this budget counts around contents (from the model profile)."""
        return framing_of(self)

    def used(self, env: Envelope | Draft, counter: TokenCounter) -> int:
        """Exact request tokens of ``env`` with this budget's message framing."""
        return request_tokens(env, counter, self.framing)
