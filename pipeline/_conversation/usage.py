"""What the provider reported for a turn, next to what Lamina predicted, and calibration.

``read_usage`` accepts an SDK response or usage object (OpenAI chat and Responses,
Anthropic, Gemini), or their plain dict forms, and normalizes them to ``Usage``: input
tokens always include the cached ones (Anthropic reports them apart; they are added).
``Calibration`` turns observed input tokens into a per-model count margin for providers
whose tokenizer is not local, so the budget follows evidence instead of a fixed guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from pipeline._errors import ConfigError
from pipeline._model.artifacts import TurnWarning

__all__ = [
    "CALIBRATION_WINDOW",
    "MARGIN_BOUNDS",
    "Calibration",
    "TurnUsage",
    "Usage",
    "read_usage",
]

# Margins are kept inside these bounds whatever the evidence says (Budget needs < 1).
MARGIN_BOUNDS = (0.0, 0.9)
# How many recent observations the margin is taken from (the largest of them wins).
CALIBRATION_WINDOW = 8


@attrs.frozen
class Usage:
    """Token figures of one request as the provider billed them.

    ``input_tokens`` counts every prompt token, cached or not; ``cached_tokens`` were
    read from the provider's prompt cache, ``cache_write_tokens`` written to it.
    """

    input_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    provider: str = ""


@attrs.frozen
class TurnUsage:
    """One turn's usage read-back: what Lamina predicted, what was observed, any warning.

    ``counted`` is Lamina's local count of the request (before any margin), the figure
    calibration compares ``observed.input_tokens`` with. ``rules`` is empty when the
    model's own profile was used, else says which generic rules stood in (a model Lamina
    has no profile for). ``cause`` names a cache miss's likely cause for programs
    (``warning`` says it for people): ``host-altered``, ``prefix-changed``, ``expired``,
    ``not-expired`` or ``unknown``; empty without a miss. ``call`` is which request of
    the turn's agent loop it was (1 for the first, the loop's steps + 1), 0 for the
    turn's own request: every call of a loop is a read-back of its own, its prediction
    that call's request (the turn's envelope, the loop's steps so far and the tools).
    """

    turn: int
    provider: str
    model: str
    predicted_input: int
    predicted_cached: int
    observed: Usage
    counted: int = 0
    exact: bool = True
    warning: TurnWarning | None = None
    rules: str = ""
    cause: str = ""
    call: int = 0


def _plain(value: Any) -> Any:
    """An SDK object (pydantic model, dataclass-like) as plain dicts and lists."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _plain(to_dict())
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return value


def _int(data: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _usage_block(data: Mapping[str, Any]) -> Mapping[str, Any]:
    for name in ("usage", "usage_metadata", "usageMetadata"):
        inner = data.get(name)
        if isinstance(inner, Mapping):
            return inner
    return data


def read_usage(response: Any, provider: str = "") -> Usage:
    """The usage of a response (or of its usage object), from any of the three providers.

    Raises ``ConfigError`` when no token figures can be found.
    """
    data = _plain(response)
    if not isinstance(data, Mapping):
        raise ConfigError("usage", f"expected a response or usage object, got {type(response)}")
    block = _usage_block(data)
    outputs = ("output_tokens", "completion_tokens", "candidates_token_count")
    output = _int(block, *outputs, "candidatesTokenCount") or 0
    # Gemini: the prompt count includes the cached content.
    gemini = _int(block, "prompt_token_count", "promptTokenCount")
    if gemini is not None:
        cached = _int(block, "cached_content_token_count", "cachedContentTokenCount") or 0
        return Usage(gemini, cached, 0, output, provider or "gemini")
    # Anthropic: input_tokens excludes what was read from or written to the cache.
    # (LiteLLM adds these to an OpenAI-shaped usage whose prompt_tokens include them.)
    anthropic = ("cache_read_input_tokens", "cache_creation_input_tokens")
    if "prompt_tokens" not in block and any(name in block for name in anthropic):
        read = _int(block, "cache_read_input_tokens") or 0
        write = _int(block, "cache_creation_input_tokens") or 0
        plain = _int(block, "input_tokens") or 0
        return Usage(plain + read + write, read, write, output, provider or "anthropic")
    # OpenAI: chat (prompt_tokens) or Responses (input_tokens), cached tokens in details.
    total = _int(block, "prompt_tokens", "input_tokens")
    if total is None:
        raise ConfigError("usage", "no input token figure in the response's usage")
    found = block.get("prompt_tokens_details") or block.get("input_tokens_details")
    details: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    cached = _int(details, "cached_tokens") or _int(block, "cached_tokens") or 0
    # Newer OpenAI SDKs report cache writes beside the reads.
    written = _int(details, "cache_write_tokens") or 0
    return Usage(total, cached, written, output, provider or "openai")


@attrs.frozen
class Calibration:
    """A model's count margin learned from observed input tokens.

    ``ratios`` are the last observed/counted ratios (newest last); the margin is the
    largest of them less one, within ``MARGIN_BOUNDS``, so one low reading never lets a
    turn overflow. Before any reading the margin is ``prior`` (the profile's guess).
    """

    model: str
    prior: float
    ratios: tuple[float, ...] = ()
    samples: int = 0

    @property
    def margin(self) -> float:
        if not self.ratios:
            return self.prior
        low, high = MARGIN_BOUNDS
        # Ratios are kept to 4 decimals (rounded up), so rounding here loses nothing.
        return min(high, max(low, round(max(self.ratios) - 1.0, 4)))

    def observe(self, counted: int, observed: int) -> Calibration:
        """The calibration after one request counted locally as ``counted`` tokens."""
        if counted <= 0 or observed <= 0:
            return self
        ratio = math.ceil(observed / counted * 10_000) / 10_000  # rounded up: never under
        window = (*self.ratios, ratio)[-CALIBRATION_WINDOW:]
        return attrs.evolve(self, ratios=window, samples=self.samples + 1)
