"""Replay configs: what one policy-lab run varies (layout, policy, budget, summarizer,
tokenizer, provider pricing), read from YAML/JSON files with every key checked."""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from lamina._budgets import budget_of, objective_of
from lamina.pipeline import Budget, Policy, Summarizer
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.inputs import LoadError, load_json, load_yaml
from lamina.pipeline.tokens import TOKENIZERS, TokenCounter
from lamina.pipeline.views import TextRankSummarizer
from lamina.renderers import DEFAULT_MODELS, LAYOUTS, request_options

__all__ = [
    "BudgetConfig",
    "ProviderPricing",
    "ReplayConfig",
    "SummarizerConfig",
    "load_config",
    "parse_config",
]

_PROVIDERS = tuple(DEFAULT_MODELS)


@attrs.frozen
class BudgetConfig:
    """A budget by model profile and/or window; None fields keep the profile's values
    (``objective``: the objective's settings, ``objective_of``; empty: the defaults)."""

    model: str | None = None
    window: int | None = None
    reserve: int | None = None
    objective: tuple[tuple[str, Any], ...] = ()

    def budget(self) -> Budget:
        """The budget by the CLI's rule (``budget_of``)."""
        if self.model is None and self.window is None:
            raise ConfigError("budget", "needs a model or a window")
        budget = budget_of(self.window, self.reserve, self.model, objective=dict(self.objective))
        assert budget is not None  # a window or a model always gives one
        return budget


@attrs.frozen
class SummarizerConfig:
    """TextRank with its settings, or a host factory ``module:callable(counter)``."""

    name: str = "textrank"
    options: tuple[tuple[str, Any], ...] = ()

    def make(self, counter: TokenCounter) -> Summarizer:
        """The summarizer; a factory that cannot be loaded or called with the counter and
        the options, or that returns no summarizer, is a ConfigError naming it."""
        if self.name == "textrank":
            return TextRankSummarizer(counter, **dict(self.options))
        module, colon, attr = self.name.partition(":")
        if not (module and colon and attr):
            raise ConfigError(
                "summarizer", f"{self.name!r} is neither 'textrank' nor 'module:callable'"
            )
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigError("summarizer", f"cannot load {self.name!r}: {exc}") from None
        try:
            made = factory(counter, **dict(self.options))
        except Exception as exc:  # the host's code: any failure is this setting's fault
            raise ConfigError(
                "summarizer",
                f"calling {self.name} with a TokenCounter"
                f"{' and the options' if self.options else ''} failed: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())}",
            ) from None
        if not (
            callable(getattr(made, "summarize", None))
            and isinstance(getattr(made, "id", None), str)
        ):
            raise ConfigError(
                "summarizer",
                f"{self.name} returned {type(made).__name__}, not a summarizer "
                "(an object with an ``id`` string and a ``summarize(text, target_tokens)``)",
            )
        summarizer: Summarizer = made
        return summarizer


@attrs.frozen
class ProviderPricing:
    """One provider's model, cache TTL and price: ``input_per_mtok`` (currency per million
    input tokens) turns the simulator's token-equivalent cost into money; ``cached_read``
    and ``cache_write`` override the model's cache prices (shares of the input price)."""

    provider: str
    model: str
    ttl: str | None = None
    input_per_mtok: float | None = None
    cached_read: float | None = None
    cache_write: float | None = None

    def shares(self) -> tuple[float, float]:
        """(read, write) prices as shares of the input price."""
        rules = request_options(self.provider, self.model, ttl=self.ttl).rules  # type: ignore[arg-type]
        read = rules.read if self.cached_read is None else self.cached_read
        write = rules.write if self.cache_write is None else self.cache_write
        return read, write


def _default_pricing() -> tuple[ProviderPricing, ...]:
    return tuple(ProviderPricing(p, DEFAULT_MODELS[p]) for p in _PROVIDERS)


@attrs.frozen
class ReplayConfig:
    """One arm of the experiment; ``name`` labels its results (default: the file's stem)."""

    name: str
    layout: str = "default"
    policy: Policy = attrs.field(factory=Policy)
    budget: BudgetConfig | None = None
    summarizer: SummarizerConfig = attrs.field(factory=SummarizerConfig)
    tokenizer: str = "o200k_base"
    providers: tuple[ProviderPricing, ...] = attrs.field(factory=_default_pricing)


_TOP = {"name", "layout", "freshness", "reattach", "policy", "budget", "summarizer"}
_TOP |= {"tokenizer", "providers"}


def load_config(path: str | Path) -> ReplayConfig:
    """Read one config file (YAML or JSON); ConfigError names the file and the key."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
        data = load_json(raw) if p.suffix == ".json" else load_yaml(raw)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), f"cannot read: {exc}") from None
    except LoadError as exc:
        raise ConfigError(str(p), f"not valid YAML/JSON: {' '.join(str(exc).split())}") from None
    try:
        return parse_config(data or {}, p.stem)
    except ConfigError as exc:
        raise ConfigError(str(p), str(exc)) from None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(where, f"must be a mapping, got {type(value).__name__}")
    return value


def _known(data: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        known_keys = ", ".join(sorted(known))
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown key (known: {known_keys})")


def _int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(where, f"must be a whole number, got {value!r}")
    return value


def _float(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(where, f"must be a number >= 0, got {value!r}")
    return float(value)


# TextRank's settings: (kind, lowest, highest, inclusive low), checked before any replay.
_TEXTRANK = {
    "window": (int, 1, None),
    "max_iter": (int, 1, None),
    "damping": (float, 0.0, 1.0),
    "tol": (float, 0.0, None),
}


def _textrank(options: Mapping[str, Any], where: str) -> None:
    for key, value in options.items():
        kind, low, high = _TEXTRANK[key]
        at = f"{where}.{key}"
        if kind is int:
            if _int(value, at) is None or value < low:
                raise ConfigError(at, f"must be a whole number >= {low}, got {value!r}")
        elif (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not low < value
            or (high is not None and not value < high)
        ):
            bound = f"between {low:g} and {high:g}" if high is not None else f"above {low:g}"
            raise ConfigError(at, f"must be a number {bound}, got {value!r}")


def parse_config(data: Any, name: str = "config", *, where: str = "config") -> ReplayConfig:
    """Validate a config mapping; every value is checked now, not when a replay runs."""
    data = _mapping(data, where)
    _known(data, _TOP, where)
    name = data.get("name", name)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name", f"must be a non-empty string, got {name!r}")
    layout = data.get("layout", "default")
    if layout not in LAYOUTS:
        raise ConfigError(f"{where}.layout", f"must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    policy_fields = dict(_mapping(data.get("policy", {}), f"{where}.policy"))
    _known(policy_fields, {a.name for a in attrs.fields(Policy)}, f"{where}.policy")
    for key in ("freshness", "reattach"):
        if key in data:
            policy_fields[key] = data[key]
    try:
        policy = Policy(**policy_fields)
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{where}.policy", str(exc)) from None
    tokenizer = data.get("tokenizer", "o200k_base")
    if tokenizer not in TOKENIZERS:
        raise ConfigError(
            f"{where}.tokenizer",
            f"unknown tokenizer {tokenizer!r} (known: {', '.join(TOKENIZERS)})",
        )
    config = ReplayConfig(
        name,
        layout,
        policy,
        _budget(data.get("budget"), f"{where}.budget"),
        _summarizer(data.get("summarizer", "textrank"), f"{where}.summarizer"),
        tokenizer,
        _providers(data.get("providers"), f"{where}.providers"),
    )
    if config.budget is not None:
        try:
            config.budget.budget()
        except ConfigError as exc:
            raise ConfigError(f"{where}.budget", str(exc)) from None
    try:
        config.summarizer.make(TokenCounter(tokenizer))
    except ConfigError as exc:
        raise ConfigError(f"{where}.summarizer", str(exc).removeprefix("summarizer: ")) from None
    return config


def _budget(value: Any, where: str) -> BudgetConfig | None:
    if value is None or value is False:
        return None
    data = _mapping(value, where)
    _known(data, {"model", "window", "reserve", "objective"}, where)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{where}.model", f"must be a model name, got {model!r}")
    window = _int(data.get("window"), f"{where}.window")
    given = data.get("objective")
    objective = () if given is None else tuple(objective_of(given, f"{where}.objective").items())
    return BudgetConfig(model, window, _int(data.get("reserve"), f"{where}.reserve"), objective)


def _summarizer(value: Any, where: str) -> SummarizerConfig:
    if isinstance(value, str):
        return SummarizerConfig(value)
    data = _mapping(value, where)
    if len(data) != 1:
        raise ConfigError(where, "must be a name, or one name mapped to its settings")
    ((name, options),) = data.items()
    opts = _mapping(options or {}, f"{where}.{name}")
    if name == "textrank":
        _known(opts, set(_TEXTRANK), f"{where}.{name}")
        _textrank(opts, f"{where}.{name}")
    return SummarizerConfig(str(name), tuple(sorted(opts.items())))


def _providers(value: Any, where: str) -> tuple[ProviderPricing, ...]:
    if value is None:
        return _default_pricing()
    data = _mapping(value, where)
    _known(data, set(_PROVIDERS), where)
    out: list[ProviderPricing] = []
    for provider in _PROVIDERS:
        if provider not in data:
            continue
        at = f"{where}.{provider}"
        raw = _mapping(data[provider] or {}, at)
        _known(raw, {"model", "ttl", "input_per_mtok", "cached_read", "cache_write"}, at)
        pricing = ProviderPricing(
            provider,
            str(raw.get("model", DEFAULT_MODELS[provider])),
            raw.get("ttl"),
            _float(raw.get("input_per_mtok"), f"{at}.input_per_mtok"),
            _float(raw.get("cached_read"), f"{at}.cached_read"),
            _float(raw.get("cache_write"), f"{at}.cache_write"),
        )
        try:
            pricing.shares()
        except ConfigError as exc:
            raise ConfigError(at, str(exc)) from None
        out.append(pricing)
    if not out:
        raise ConfigError(where, f"name at least one of {', '.join(_PROVIDERS)}")
    return tuple(out)
