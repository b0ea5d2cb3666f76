"""The aggregate of a replay run: per config totals, percentiles and the cheapest config
per provider, as a table for people and as JSON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from rich.table import Table

    from lamina._replay import ReplayResult, ReplayRun

__all__ = ["ConfigSummary", "ProviderSummary", "RunSummary", "percentile", "summarize"]

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: int) -> float:
    """Nearest-rank percentile (an observed value, so it is exact and deterministic)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@attrs.frozen
class ProviderSummary:
    """One provider under one config, over the conversations every config completed."""

    provider: str
    model: str
    input_tokens: int
    cached_tokens: int
    cost: float
    usd: float | None
    cost_percentiles: tuple[tuple[int, float], ...]

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_share": round(self.cached_share, 4),
            "cost": round(self.cost, 4),
            "usd": None if self.usd is None else round(self.usd, 6),
            "cost_per_conversation": {f"p{q}": round(v, 4) for q, v in self.cost_percentiles},
        }


@attrs.frozen
class ConfigSummary:
    """One config: how many conversations replayed, failed, broke an invariant; token
    totals and percentiles; decisions by kind; per provider costs."""

    config: str
    conversations: int
    errors: int
    invariant_failures: int
    unrebuilt: int
    turns: int
    tokens_sent: int
    tokens_percentiles: tuple[tuple[int, int], ...]
    peak_tokens: int
    decisions: tuple[tuple[str, int], ...]
    providers: tuple[ProviderSummary, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "errors": self.errors,
            "invariant_failures": self.invariant_failures,
            "conversations_with_unrebuilt": self.unrebuilt,
            "turns": self.turns,
            "tokens_sent": self.tokens_sent,
            "tokens_per_conversation": {f"p{q}": v for q, v in self.tokens_percentiles},
            "peak_tokens": self.peak_tokens,
            "decisions": dict(self.decisions),
            "providers": {p.provider: p.to_json() for p in self.providers},
        }


@attrs.frozen
class RunSummary:
    """Per config summaries; ``compared`` counts the conversations every config replayed
    without error (costs and winners are over those, so configs compare like for like);
    ``winners`` maps each provider to the cheapest config (money when every config has a
    price for it, else token-equivalent cost; ties go to the earlier config)."""

    conversations: int
    compared: int
    configs: tuple[ConfigSummary, ...]
    winners: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "lamina_replay_summary": 1,
            "conversations": self.conversations,
            "compared": self.compared,
            "configs": {c.config: c.to_json() for c in self.configs},
            "winners": dict(self.winners),
        }

    def table(self) -> Table:
        from rich.table import Table

        table = Table(
            title=f"replay: {self.conversations} conversations, {self.compared} compared "
            "(replayed by every config)"
        )
        # Config names are never cut: they wrap.
        table.add_column("config", justify="left", overflow="fold", min_width=8)
        for col in (
            "conversations ok",
            "failed",
            "invariant failures",
            "turns",
            "tokens sent",
            "tokens/conv p50",
            "tokens/conv p90",
        ):
            table.add_column(col, justify="right")
        providers = sorted({p.provider for c in self.configs for p in c.providers})
        for provider in providers:
            table.add_column(f"{provider} cost (cached)", justify="right")
        winners = dict(self.winners)
        for c in self.configs:
            pct = dict(c.tokens_percentiles)
            row = [
                c.config,
                str(c.conversations - c.errors),
                str(c.errors),
                str(c.invariant_failures),
                str(c.turns),
                f"{c.tokens_sent:,}",
                f"{pct[50]:,}",
                f"{pct[90]:,}",
            ]
            for provider in providers:
                p = next((x for x in c.providers if x.provider == provider), None)
                if p is None:
                    row.append("-")
                    continue
                money = f"${p.usd:,.4f}" if p.usd is not None else f"{p.cost:,.0f}"
                star = "*" if winners.get(provider) == c.config else ""
                row.append(f"{star}{money} ({p.cached_share:.0%})")
            table.add_row(*row)
        table.caption = (
            "failed: conversations a turn of which raised; invariant failures: conversations "
            "whose envelopes broke one of Lamina's checks (check_envelope); tokens/conv p50, "
            "p90: input tokens sent per conversation, median and 90th percentile; cost "
            "(cached): the input bill and its cached share; * cheapest config per provider; "
            "cost in input-token equivalents unless priced"
        )
        return table


def _provider(
    name: str, results: Sequence[ReplayResult]
) -> ProviderSummary | None:
    bills = [p for r in results if (p := r.provider(name)) is not None]
    if not bills:
        return None
    usd = None if any(b.usd is None for b in bills) else sum(b.usd or 0.0 for b in bills)
    costs = [b.cost for b in bills]
    return ProviderSummary(
        name,
        bills[0].model,
        sum(b.input_tokens for b in bills),
        sum(b.cached_tokens for b in bills),
        sum(costs),
        usd,
        tuple((q, percentile(costs, q)) for q in PERCENTILES),
    )


def summarize(run: ReplayRun) -> RunSummary:
    """The aggregate of a run (deterministic: it reads only the sorted results)."""
    by_config: dict[str, list[ReplayResult]] = {c.name: [] for c in run.configs}
    for r in run.results:
        by_config[r.config].append(r)
    failed = {r.conversation for r in run.results if r.errors}
    names = sorted({p.provider for c in run.configs for p in c.providers})
    summaries: list[ConfigSummary] = []
    for config in run.configs:
        results = by_config[config.name]
        compared = [r for r in results if r.conversation not in failed]
        tokens = [r.tokens_sent for r in compared]
        decisions: dict[str, int] = {}
        for r in results:
            for kind, n in r.decisions:
                decisions[kind] = decisions.get(kind, 0) + n
        summaries.append(
            ConfigSummary(
                config.name,
                len(results),
                sum(1 for r in results if r.errors),
                sum(1 for r in results if r.invariant is not None),
                sum(1 for r in results if r.unrebuilt),
                sum(r.turns for r in results),
                sum(tokens),
                tuple((q, int(percentile(tokens, q))) for q in PERCENTILES),
                max((r.peak_tokens for r in compared), default=0),
                tuple(sorted(decisions.items())),
                tuple(p for n in names if (p := _provider(n, compared)) is not None),
            )
        )
    winners: list[tuple[str, str]] = []
    for name in names:
        bills = [(c.config, p) for c in summaries for p in c.providers if p.provider == name]
        if not bills:
            continue
        priced = all(p.usd is not None for _, p in bills)
        best = min(bills, key=lambda b: (b[1].usd or 0.0) if priced else b[1].cost)
        winners.append((name, best[0]))
    conversations = len({r.conversation for r in run.results})
    return RunSummary(
        conversations, conversations - len(failed), tuple(summaries), tuple(winners)
    )
