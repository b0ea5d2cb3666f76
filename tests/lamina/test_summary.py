"""The run summary: totals over the conversations every config replayed, winners."""

from __future__ import annotations

from lamina import ProviderResult, ReplayConfig, ReplayError, ReplayResult, ReplayRun, summarize
from lamina._summary import percentile


def _result(
    conv: str, config: str, cost: float, tokens: int, *, error: bool = False
) -> ReplayResult:
    bill = ProviderResult("openai", "gpt-4.1", tokens, tokens // 2, 0, cost, cost / 1e6)
    return ReplayResult(
        conv,
        config,
        "script",
        2,
        2,
        tokens,
        tokens,
        (bill,),
        (("budget:full->preview", 1),),
        errors=(ReplayError(2, "BudgetExceeded", "too big"),) if error else (),
    )


def test_percentiles_are_nearest_rank_observed_values() -> None:
    values = [5, 1, 4, 2, 3]
    assert [percentile(values, q) for q in (50, 90, 99, 100)] == [3, 5, 5, 5]
    assert percentile([], 50) == 0


def test_costs_compare_only_conversations_every_config_replayed() -> None:
    configs = (ReplayConfig("a"), ReplayConfig("b"))
    results = (
        _result("c1", "a", 10.0, 100),
        _result("c1", "b", 8.0, 90),
        _result("c2", "a", 30.0, 300),
        _result("c2", "b", 1.0, 10, error=True),  # b failed c2: c2 is left out of costs
        _result("c3", "a", 20.0, 200),
        _result("c3", "b", 25.0, 250),
    )
    summary = summarize(ReplayRun(configs, results, 3))
    doc = summary.to_json()
    assert (doc["conversations"], doc["compared"]) == (3, 2)
    a, b = doc["configs"]["a"], doc["configs"]["b"]
    assert (a["errors"], b["errors"]) == (0, 1)
    assert (a["turns"], a["tokens_sent"]) == (6, 300)
    assert a["providers"]["openai"]["cost"] == 30.0 and b["providers"]["openai"]["cost"] == 33.0
    assert a["providers"]["openai"]["cached_share"] == 0.5
    assert a["tokens_per_conversation"] == {"p50": 100, "p90": 200, "p99": 200}
    assert b["decisions"] == {"budget:full->preview": 3}
    assert doc["winners"] == {"openai": "a"}
