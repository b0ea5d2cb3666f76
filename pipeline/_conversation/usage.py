"""What the provider reported for a turn, next to what Lamina predicted, and calibration.

``read_usage`` accepts an SDK response or usage object (OpenAI chat and Responses,
Anthropic, Gemini), a framework's (pydantic-ai's ``RequestUsage`` or ``ModelResponse``,
LangChain's ``usage_metadata`` or ``AIMessage``), or their plain dict forms, and
normalizes them to ``Usage``: input tokens always include the cached ones (Anthropic
reports them apart; they are added; the frameworks have already added them). A usage
that sums several requests (a run's) is refused: each request is read back alone.
``Calibration`` turns observed input tokens into a per-model count margin for providers
whose tokenizer is not local, so the budget follows evidence instead of a fixed guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._model.artifacts import TurnWarning

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


def _named_provider(data: Mapping[str, Any]) -> str:
    """The provider a framework's response names (pydantic-ai's ``provider_name``,
    LangChain's ``response_metadata.model_provider``), as Lamina names it; else ""."""
    meta = data.get("response_metadata")
    name = data.get("provider_name")
    if name is None and isinstance(meta, Mapping):
        name = meta.get("model_provider")
    if not isinstance(name, str):
        return ""
    if name.startswith(("google", "gemini")):
        return "gemini"
    return name if name in ("openai", "anthropic") else ""


def read_usage(response: Any, provider: str = "") -> Usage:
    """The usage of one request: a response or its usage object, from any of the three
    providers, pydantic-ai (``ModelResponse.usage``: ``cache_read_tokens`` and
    ``cache_write_tokens``, already within ``input_tokens``) or LangChain
    (``AIMessage.usage_metadata``: ``input_token_details``, likewise within).

    Raises ``ConfigError`` when no token figures can be found, or when the figures sum
    several requests (a run's usage: pydantic-ai's ``result.usage()``, the Agents SDK's
    ``context_wrapper.usage``): read each request's own (``ModelResponse.usage``,
    ``raw_responses[i].usage``).
    """
    data = _plain(response)
    if not isinstance(data, Mapping):
        raise ConfigError("usage", f"expected a response or usage object, got {type(response)}")
    provider = provider or _named_provider(data)
    block = _usage_block(data)
    requests = _int(block, "requests")
    if requests is not None and requests > 1:
        raise ConfigError(
            "usage",
            f"this usage sums {requests} requests (a run's): read back each request's own "
            "usage (pydantic-ai: each ModelResponse.usage; Agents SDK: raw_responses[i].usage)",
        )
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
    # pydantic-ai: input_tokens include the cache reads and writes beside them.
    if "prompt_tokens" not in block and any(
        name in block for name in ("cache_read_tokens", "cache_write_tokens")
    ):
        read = _int(block, "cache_read_tokens") or 0
        write = _int(block, "cache_write_tokens") or 0
        return Usage(_int(block, "input_tokens") or 0, read, write, output, provider or "openai")
    # LangChain: input_tokens include the cache reads and writes in input_token_details
    # (Anthropic's writes as cache_creation, or by TTL when it reports them so).
    details_lc = block.get("input_token_details")
    if isinstance(details_lc, Mapping) and "input_tokens" in block:
        read = _int(details_lc, "cache_read") or 0
        by_ttl = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
        write = _int(details_lc, "cache_creation") or sum(
            _int(details_lc, name) or 0 for name in by_ttl
        )
        plain = _int(block, "input_tokens") or 0
        return Usage(plain, read, write, output, provider or "openai")
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
