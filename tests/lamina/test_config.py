"""Replay configs: every key is checked when the file is read, and names the culprit."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from lamina import BudgetConfig, ProviderPricing, load_config, parse_config
from lamina.pipeline import Budget, Policy
from lamina.pipeline.budget import BudgetPlan
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


def test_a_budget_plan_is_set_by_its_fields_and_the_others_keep_their_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "floors.yaml"
    path.write_text(
        "budget:\n"
        "  window: 8000\n"
        "  plan: {library_floor: 0.4, history_turns: 3, slack: 0, restore: false}\n",
        encoding="utf-8",
    )
    config = load_config(path)
    plan = BudgetPlan(library_floor=0.4, history_turns=3, slack=0.0, restore=False)
    assert config.budget == BudgetConfig(None, 8000, None, plan)
    assert config.budget.budget().plan == plan
    assert config.budget.budget().plan.restore_min == BudgetPlan().restore_min
    assert dict(config.budget.budget().plan.fields())["slack"] == "0.0"  # a float, as stored
    assert parse_config({"budget": {"window": 8000}}).budget.budget().plan == BudgetPlan()


def _changed(field: attrs.Attribute[object]) -> object:
    """A valid value other than the field's default, from its type alone."""
    default = field.default
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    assert isinstance(default, float)
    return round(default / 2, 3)


@pytest.mark.parametrize("field", attrs.fields(BudgetPlan), ids=lambda f: f.name)
def test_every_field_of_the_budget_plan_can_be_set(field: attrs.Attribute[object]) -> None:
    """Read over BudgetPlan's own fields: a field added or renamed there is settable here."""
    value = _changed(field)
    data = {"budget": {"model": "gpt-4o", "plan": {field.name: value}}}
    budget = parse_config(data).budget
    assert budget is not None
    assert getattr(budget.budget().plan, field.name) == value != field.default


@pytest.mark.parametrize(
    ("plan", "culprit"),
    [
        ({"floor": 0.3}, "config.budget.plan.floor: unknown key (known: library_floor, "),
        ({"library_floor": 1.5}, "config.budget.plan.library_floor: must be in [0, 1)"),
        ({"slack": -0.1}, "config.budget.plan.slack: must be in [0, 1)"),
        ({"restore_min": float("nan")}, "config.budget.plan.restore_min: must be in [0, 1)"),
        ({"history_turns": 2.5}, "config.budget.plan.history_turns: must be an integer"),
        ({"history_turns": -1}, "config.budget.plan.history_turns: must be at least 0"),
        ({"restore": "yes"}, "config.budget.plan.restore: must be True or False"),
        ({"library_floor": "0.3"}, "config.budget.plan.library_floor: must be a number"),
        ([0.3], "config.budget.plan: must be a mapping, got list"),
    ],
)
def test_a_bad_budget_plan_is_refused_naming_its_field(plan: object, culprit: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"budget": {"window": 8000, "plan": plan}})
    assert str(caught.value).startswith(culprit)
