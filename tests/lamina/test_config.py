"""Replay configs: every key is checked when the file is read, and names the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import BudgetConfig, ProviderPricing, load_config, parse_config
from lamina.pipeline import Budget, Policy
from lamina.pipeline.errors import ConfigError


def test_a_yaml_config_sets_every_dimension(tmp_path: Path) -> None:
    path = tmp_path / "lean.yaml"
    path.write_text(
        "layout: append-only\n"
        "freshness: refresh\n"
        "reattach: reference\n"
        "policy: {verbatim_tokens: 900}\n"
        "budget: {model: gpt-4o, window: 60000}\n"
        "summarizer: {textrank: {damping: 0.9}}\n"
        "tokenizer: cl100k_base\n"
        "providers:\n"
        "  anthropic: {model: claude-sonnet-4-5, ttl: 1h, input_per_mtok: 3, cached_read: 0.2}\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.name == "lean" and config.layout == "append-only"
    assert config.policy == Policy("refresh", "reference", verbatim_tokens=900)
    assert config.budget == BudgetConfig("gpt-4o", 60000)
    assert config.budget.budget() == Budget.for_model("gpt-4o", context_window=60000)
    assert config.summarizer.options == (("damping", 0.9),)
    assert config.tokenizer == "cl100k_base"
    (anthropic,) = config.providers
    assert anthropic == ProviderPricing("anthropic", "claude-sonnet-4-5", "1h", 3.0, 0.2)
    assert anthropic.shares() == (0.2, 2.0)  # the 1-hour write price stays the model's


def test_the_defaults_are_the_library_defaults_and_all_three_providers() -> None:
    config = parse_config({}, "plain")
    assert (config.name, config.layout, config.policy, config.budget) == (
        "plain",
        "default",
        Policy(),
        None,
    )
    assert [p.provider for p in config.providers] == ["openai", "anthropic", "gemini"]


@pytest.mark.parametrize(
    ("data", "culprit"),
    [
        ({"layuot": "default"}, "config.layuot"),
        ({"layout": "sideways"}, "config.layout"),
        ({"freshness": "sometimes"}, "config.policy"),
        ({"policy": {"verbatim": 3}}, "config.policy.verbatim"),
        ({"budget": {"window": "big"}}, "config.budget.window"),
        ({"budget": {"model": "gpt-99"}}, "config.budget"),
        ({"budget": {"window": 100, "reserve": 200}}, "config.budget"),
        ({"tokenizer": "bert"}, "config.tokenizer"),
        ({"summarizer": {"textrank": {"dampng": 1}}}, "config.summarizer.textrank.dampng"),
        ({"summarizer": "nowhere:make"}, "config.summarizer"),
        ({"summarizer": "os:getcwd"}, "config.summarizer: calling os:getcwd with a TokenCounter"),
        ({"summarizer": "builtins:str"}, "config.summarizer: builtins:str returned str, not a"),
        ({"summarizer": "os"}, "config.summarizer: 'os' is neither"),
        ({"summarizer": ""}, "config.summarizer: '' is neither"),
        ({"summarizer": {"textrank": {"window": "x"}}}, "config.summarizer.textrank.window"),
        ({"summarizer": {"textrank": {"window": 0}}}, "config.summarizer.textrank.window"),
        ({"summarizer": {"textrank": {"damping": 1.5}}}, "config.summarizer.textrank.damping"),
        ({"summarizer": {"textrank": {"tol": float("nan")}}}, "config.summarizer.textrank.tol"),
        ({"name": ["a"]}, "config.name"),
        ({"providers": {"openai": {"input_per_mtok": float("inf")}}}, "config.providers.openai"),
        ({"providers": {"mistral": {}}}, "config.providers.mistral"),
        ({"providers": {"openai": {"model": "claude-sonnet-4"}}}, "config.providers.openai"),
        ({"providers": {"openai": {"input_per_mtok": -1}}}, "config.providers.openai"),
        ({"providers": {}}, "config.providers"),
    ],
)
def test_a_bad_value_is_refused_with_its_key(data: dict[str, object], culprit: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert str(caught.value).startswith(culprit)


def test_an_unreadable_config_names_its_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("layout: [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(path)


def test_the_objectives_settings_are_set_by_name_and_the_others_keep_their_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "objective.yaml"
    path.write_text(
        "budget:\n"
        "  window: 8000\n"
        "  objective: {headroom: 0.1, cache_weight: 1, source_weights: {web: 0.5}}\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.budget is not None
    budget = config.budget.budget()
    assert (budget.headroom, budget.cache_weight) == (0.1, 1.0)
    assert budget.source_weight("web") == 0.5 and budget.source_weight("note") == 1.0
    assert budget.text_free_share == Budget(8000, 2000).text_free_share
    plain = parse_config({"budget": {"window": 8000}}).budget
    assert plain is not None and plain.budget() == Budget(8000, 2000)


@pytest.mark.parametrize(
    ("objective", "culprit"),
    [
        ({"floor": 0.3}, "config.budget.objective.floor: unknown key (known: headroom, "),
        ({"policy": "current-first"}, "config.budget.objective.policy: unknown key (known: "),
        ({"history_step": 4}, "config.budget.objective.history_step: unknown key (known: "),
        ({"reply_tokens": 400}, "config.budget.objective.reply_tokens: unknown key (known: "),
        ({"summary_tokens": 256}, "config.budget.objective.summary_tokens: unknown key (known:"),
        ({"headroom": 1.5}, "config.budget.objective.headroom: must be in [0, 1)"),
        ({"text_free_share": -0.1}, "config.budget.objective.text_free_share: must be in [0, 1)"),
        ({"cache_weight": "high"}, "config.budget.objective.cache_weight: must be a number"),
        ({"source_weights": 3}, "config.budget.objective.source_weights: must map source types"),
        ([0.3], "config.budget.objective: must be a mapping, got list"),
    ],
)
def test_a_bad_objective_setting_is_refused_naming_its_field(
    objective: object, culprit: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"budget": {"window": 8000, "objective": objective}})
    assert str(caught.value).startswith(culprit)
