"""Cache-cost simulator: per turn, the tokens each provider would serve from its prompt cache.

Every layout's requests come from ``lamina.renderers._layouts`` and every rule from
``lamina.renderers._providers.cache_rules`` (the table the request renderers use), so the
numbers describe the requests Lamina actually sends. The cache is assumed warm for the
whole conversation (every earlier request is still cached: no TTL expiry, same routing).
Token counts use the conversation's local tokenizer for all three providers. OpenAI's and
Gemini's input is the request's own count (``lamina.renderers.prompt_tokens``: contents and
chat framing, as the budget counts it) and their shared prefix is counted in that unit
(``prompt_prefix_tokens``); Anthropic's is its content blocks. The cached figures apply
each provider's rules (minimum prefix, 128-token steps, breakpoints): provider-specific.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from lamina.pipeline import Budget, Envelope
from lamina.pipeline.errors import ArgumentError
from lamina.pipeline.text import text_hash
from lamina.pipeline.tokens import ModelProfile, TokenCounter
from lamina.renderers._cache import prompt_prefix_tokens, prompt_tokens
from lamina.renderers._layouts import LAYOUTS, Layout, Prompt, build_prompt
from lamina.renderers._openai import common_prefix_length
from lamina.renderers._providers import (
    CacheRules,
    Ttl,
    anthropic_breakpoints,
    flat_blocks,
    request_options,
)

__all__ = [
    "NAIVE_NOTE",
    "PROVIDERS",
    "Series",
    "Simulation",
    "TurnCost",
    "breakpoint_cache_costs",
    "format_baseline",
    "format_simulation",
    "prefix_cache_costs",
    "shared_prefix_costs",
    "simulate",
]

PROVIDERS = ("openai", "anthropic", "gemini")


@attrs.frozen
class TurnCost:
    """One request: input tokens, how many were read from / written to the cache, and
    the input cost relative to the same request sent uncached."""

    turn: int
    input_tokens: int
    cached_tokens: int
    written_tokens: int
    cost: float

    @property
    def uncached_tokens(self) -> int:
        return self.input_tokens - self.cached_tokens

    @property
    def relative_cost(self) -> float:
        return self.cost / self.input_tokens if self.input_tokens else 1.0


@attrs.frozen
class Series:
    """One layout under one provider's rules, turn by turn."""

    layout: Layout
    provider: str
    model: str
    turns: tuple[TurnCost, ...]

    @property
    def input_tokens(self) -> int:
        return sum(t.input_tokens for t in self.turns)

    @property
    def cached_tokens(self) -> int:
        return sum(t.cached_tokens for t in self.turns)

    @property
    def cost(self) -> float:
        return sum(t.cost for t in self.turns)

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def relative_cost(self) -> float:
        """Cost over the same requests sent uncached."""
        return self.cost / self.input_tokens if self.input_tokens else 1.0

    @property
    def largest(self) -> int:
        """The largest request's input tokens."""
        return max((t.input_tokens for t in self.turns), default=0)

    def over(self, limit: int) -> int:
        """How many requests have more input tokens than ``limit`` (window - reserve)."""
        return sum(t.input_tokens > limit for t in self.turns)


NAIVE_NOTE = (
    "naive: the yardstick, not a layout Lamina sends: each request is the system prompt, "
    "the bare history and every attachment so far in full in the last user message. It "
    "holds the same context as the default without a budget, minus the library heading and "
    "reference lines (so it can send a little less), but that message changes every turn, "
    "so hardly anything past the system prompt is cached. It carries the budget's cuts the "
    "envelopes hold but is not fitted to the window, so a long chat overflows it."
)


@attrs.frozen
class Simulation:
    """All series; ``baseline`` is the naive layout's uncached input per provider, the
    common yardstick for comparing layouts. ``limit`` (window - reserve, from the budget)
    makes each layout's requests over it and its largest request part of the figures."""

    series: tuple[Series, ...]
    limit: int | None = None

    def get(self, layout: str, provider: str) -> Series:
        for s in self.series:
            if s.layout == layout and s.provider == provider:
                return s
        raise ArgumentError("layout", f"no series for layout {layout!r} and provider {provider!r}")

    def vs_naive(self, layout: str, provider: str) -> float | None:
        """Cost of ``layout`` over the naive layout's uncached input (None without naive)."""
        try:
            naive = self.get("naive", provider)
        except ArgumentError:
            return None
        return self.get(layout, provider).cost / naive.input_tokens if naive.input_tokens else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in self.series:
            out.setdefault(s.layout, {})[s.provider] = {
                "model": s.model,
                "input_tokens": s.input_tokens,
                "cached_tokens": s.cached_tokens,
                "cached_share": round(s.cached_share, 4),
                "relative_cost": round(s.relative_cost, 4),
                "cost_vs_naive": _round(self.vs_naive(s.layout, s.provider)),
                "largest_request": s.largest,
                **({} if self.limit is None else {"over_limit": s.over(self.limit)}),
                "turns": [
                    {
                        "turn": t.turn,
                        "input_tokens": t.input_tokens,
                        "cached_tokens": t.cached_tokens,
                        "uncached_tokens": t.uncached_tokens,
                        "written_tokens": t.written_tokens,
                        "relative_cost": round(t.relative_cost, 4),
                    }
                    for t in s.turns
                ],
            }
        limit = {} if self.limit is None else {"limit": self.limit}
        return {"lamina_simulation": 1, **limit, "layouts": out}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def prefix_cache_costs(requests: Sequence[Sequence[int]], rules: CacheRules) -> list[TurnCost]:
    """Automatic prefix caching (OpenAI, Gemini implicit): a request reads the longest
    token prefix it shares with any earlier request, if at least ``rules.min_tokens``
    long, rounded down to ``rules.step``; everything else is billed at the input price."""
    shared = [
        max((common_prefix_length(earlier, tokens) for earlier in requests[:n]), default=0)
        for n, tokens in enumerate(requests)
    ]
    return shared_prefix_costs([len(t) for t in requests], shared, rules)


def shared_prefix_costs(
    totals: Sequence[int], shared: Sequence[int], rules: CacheRules
) -> list[TurnCost]:
    """``prefix_cache_costs`` from each request's tokens and the longest prefix it shares
    with an earlier request (both in one unit)."""
    costs: list[TurnCost] = []
    for n, (total, best) in enumerate(zip(totals, shared, strict=True)):
        cached = best - best % rules.step if best >= rules.min_tokens else 0
        cost = (total - cached) + rules.read * cached
        costs.append(TurnCost(n + 1, total, cached, 0, cost))
    return costs


def _chat_key(prompt: Prompt) -> str:
    """The prompt's messages as one string, to find which earlier request shares most."""
    return "".join(f"\x00{role}\x01{text}" for role, text in prompt.chat())


def _prefix_requests(
    prompts: Sequence[Prompt], counter: TokenCounter, budget: Budget | None
) -> tuple[list[int], list[int]]:
    """Each request's tokens and the longest prefix it shares with an earlier one, in the
    request's own count; the earlier one is the one sharing the most characters (the
    latest on a tie), so each request is compared in tokens once."""
    keys = [_chat_key(p) for p in prompts]
    totals = [prompt_tokens(p, counter, budget) for p in prompts]
    shared: list[int] = []
    for n, prompt in enumerate(prompts):
        best, chars = -1, -1
        for m in range(n):
            same = common_prefix_length(keys[m], keys[n])
            if same >= chars:
                best, chars = m, same
        earlier = prompts[best] if best >= 0 else None
        shared.append(prompt_prefix_tokens(earlier, prompt, counter, budget))
    return totals, shared


def breakpoint_cache_costs(
    requests: Sequence[tuple[Sequence[tuple[str, int]], Sequence[int]]], rules: CacheRules
) -> list[TurnCost]:
    """Anthropic's explicit caching. Each request is ``(blocks, breakpoints)``: blocks as
    (identity, tokens) in order, breakpoints as block indices. A breakpoint reads the
    longest cached prefix ending at it or up to ``rules.lookback`` blocks before it; the
    tokens from there to the last breakpoint are written (``rules.write``); the rest is
    plain input. Every breakpoint's prefix is cached for later requests."""
    store: set[str] = set()
    costs: list[TurnCost] = []
    for n, (blocks, marks) in enumerate(requests):
        keys: list[str] = []
        cum: list[int] = []
        chain, total = "", 0
        for ident, tokens in blocks:
            chain = text_hash(chain + "\x00" + ident)
            total += tokens
            keys.append(chain)
            cum.append(total)
        read = 0
        for bp in marks:
            for j in range(bp, max(-1, bp - rules.lookback - 1), -1):
                if keys[j] in store:
                    read = max(read, cum[j])
                    break
        written = max(0, cum[marks[-1]] - read) if marks else 0
        store.update(keys[bp] for bp in marks)
        cost = (total - read - written) + rules.read * read + rules.write * written
        costs.append(TurnCost(n + 1, total, read, written, cost))
    return costs


def _anthropic_request(
    prompt: Prompt, counter: TokenCounter, rules: CacheRules
) -> tuple[list[tuple[str, int]], tuple[int, ...]]:
    flat = flat_blocks(prompt)
    roles = ["system", *(m.role for m in prompt.messages)]
    blocks = [(f"{m}:{roles[m + 1]}:{b.text}", counter.count(b.text)) for m, b in flat]
    return blocks, anthropic_breakpoints(prompt, counter, rules.min_tokens, rules.breakpoints)


def simulate(
    envelopes: Sequence[Envelope],
    *,
    counter: TokenCounter | None = None,
    providers: Sequence[str] = PROVIDERS,
    models: Mapping[str, str] | None = None,
    layouts: Sequence[Layout] = LAYOUTS,
    ttl: Ttl | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
    budget: Budget | None = None,
) -> Simulation:
    """Cost every layout of a conversation (its envelopes in order) under each provider
    (``profiles``: a provider's profile when its model has no built-in one); ``budget``
    gives the chat framing requests are counted with (else OpenAI's)."""
    count = counter or TokenCounter()
    prompts = {
        layout: [build_prompt(envelopes[: i + 1], layout, count) for i in range(len(envelopes))]
        for layout in layouts
    }
    series: list[Series] = []
    chat: dict[Layout, tuple[list[int], list[int]]] = {}
    for layout in layouts:
        for provider in providers:
            options = request_options(
                provider,
                (models or {}).get(provider),
                profile=(profiles or {}).get(provider),
                counter=count,
                ttl=ttl,
            )
            rules = options.rules
            if provider == "anthropic":
                reqs = [_anthropic_request(p, count, rules) for p in prompts[layout]]
                costs = breakpoint_cache_costs(reqs, rules)
            else:
                if layout not in chat:
                    chat[layout] = _prefix_requests(prompts[layout], count, budget)
                costs = shared_prefix_costs(*chat[layout], rules)
            turns = tuple(
                attrs.evolve(c, turn=e.turn) for c, e in zip(costs, envelopes, strict=True)
            )
            series.append(Series(layout, provider, options.model, turns))
    return Simulation(tuple(series), None if budget is None else budget.limit)


def format_simulation(sim: Simulation) -> str:
    """A plain-text table: per layout and provider, cached share and relative costs; with
    a limit, each layout's largest request and how many requests pass it."""
    head = f"{'layout':<12} {'provider':<10} {'model':<18} {'input':>9} {'cached':>9} "
    head += f"{'cached%':>8} {'cost/uncached':>14} {'cost/naive':>11} {'largest':>8}"
    if sim.limit is not None:
        head += f" {'over':>5}"
    lines = [
        "cached: what each provider's rules would serve from its cache (simulated: minimum "
        "prefix, 128-token steps, Anthropic's breakpoints)",
        *(
            [f"over: requests over the limit of {sim.limit:,} tokens (window - reserve)"]
            if sim.limit is not None
            else []
        ),
        head,
        "-" * len(head),
    ]
    for s in sim.series:
        naive = sim.vs_naive(s.layout, s.provider)
        line = (
            f"{s.layout:<12} {s.provider:<10} {s.model:<18} {s.input_tokens:>9} "
            f"{s.cached_tokens:>9} {s.cached_share:>8.1%} {s.relative_cost:>14.3f} "
            f"{'-' if naive is None else f'{naive:.3f}':>11} {s.largest:>8}"
        )
        if sim.limit is not None:
            line += f" {s.over(sim.limit):>5}"
        lines.append(line)
    if any(s.layout == "naive" for s in sim.series):
        lines += ["", NAIVE_NOTE]
    return "\n".join(lines)


def format_baseline(sim: Simulation, provider: str = "openai") -> str:
    """One line per layout under ``provider``: tokens sent, requests over the limit, the
    largest request, the input cost relative to naive sent uncached (the claim beside its
    baseline)."""
    lines = []
    for s in (s for s in sim.series if s.provider == provider and s.layout != "batched"):
        over = (
            "" if sim.limit is None else f", {s.over(sim.limit)} of {len(s.turns)} over the limit"
        )
        naive = sim.vs_naive(s.layout, provider)
        cost = "" if naive is None else f", cost {naive:.3f} of naive uncached"
        lines.append(
            f"  {s.layout:<12} {s.input_tokens:>7,} tokens sent, {s.cached_share:.0%} cached "
            f"({provider}'s rules), "
            f"largest request {s.largest:,}{over}{cost}"
        )
    return "\n".join(lines)
