"""Model profiles as data (pipeline._tokens.profiles)."""

from __future__ import annotations

import datetime

import cattrs
import pytest

from lamina.pipeline import Budget, BudgetSettings
from lamina.pipeline._errors import ConfigError
from lamina.pipeline._tokens.counter import TOKENIZERS
from lamina.pipeline._tokens.profiles import (
    PROFILES,
    ModelProfile,
    generic_profile,
    get_profile,
    provider_of,
)
from lamina.pipeline.tokens import TokenCounter


def test_gpt_4o_profile() -> None:
    profile = get_profile("gpt-4o")
    assert (profile.provider, profile.context_window, profile.default_output_reserve) == (
        "openai",
        128_000,
        16_384,
    )
    assert profile.input_budget == 128_000 - 16_384
    assert (profile.exact_tokens, profile.safety_margin, profile.tokenizer) == (
        True,
        0.0,
        "o200k_base",
    )
    assert profile.framing_tokens(4) == 3 * 4 + 3


def test_gpt_5_input_budget_matches_its_input_limit() -> None:
    assert get_profile("gpt-5").input_budget == 272_000


def test_dated_snapshot_names_resolve_to_their_alias() -> None:
    assert get_profile("claude-sonnet-4-5-20250929") is PROFILES["claude-sonnet-4-5"]
    assert get_profile("gpt-4o-2024-08-06") is PROFILES["gpt-4o"]


def test_overrides_give_a_new_profile_and_leave_the_builtin_alone() -> None:
    profile = get_profile("claude-sonnet-4-5", context_window=1_000_000, safety_margin=0.2)
    assert (profile.context_window, profile.safety_margin) == (1_000_000, 0.2)
    assert PROFILES["claude-sonnet-4-5"].context_window == 200_000


def test_unknown_model_names_close_matches() -> None:
    with pytest.raises(ConfigError, match=r"unknown model 'gpt-4-o'.*did you mean gpt-4o"):
        get_profile("gpt-4-o")


def test_unknown_override_field_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown profile field.*window"):
        get_profile("gpt-4o", window=5)


def test_invalid_override_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="default_output_reserve"):
        get_profile("gpt-4o", default_output_reserve=200_000)


def test_exact_profiles_take_no_margin() -> None:
    with pytest.raises(ConfigError, match="safety_margin"):
        ModelProfile("x", "openai", 1000, 100, safety_margin=0.1)


def test_estimated_counts_are_scaled_by_the_margin() -> None:
    profile = get_profile("claude-haiku-4-5")
    assert profile.exact_tokens is False
    assert profile.effective_tokens(1000) == 1300
    assert get_profile("gpt-4.1").effective_tokens(1000) == 1000


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_builtin_profile_is_consistent(name: str) -> None:
    profile = PROFILES[name]
    assert profile.name == name
    assert profile.tokenizer in TOKENIZERS
    assert profile.exact_tokens == (profile.provider == "openai")
    assert (profile.safety_margin > 0) == (not profile.exact_tokens)
    assert 0 < profile.input_budget < profile.context_window
    assert profile.min_cacheable_tokens >= 1024


def test_chat_template_must_be_known() -> None:
    with pytest.raises(ConfigError, match="chat_template 'chatml' is not one of messages, mistral"):
        get_profile("gpt-4o", chat_template="chatml")
    with pytest.raises(ConfigError, match="budget.chat_template"):
        Budget(8000, chat_template="chatml")


def test_mistral_profiles_put_the_system_text_in_the_last_user_message() -> None:
    profile = get_profile("mistral-nemo-instruct-2407")
    assert (profile.tokenizer, profile.chat_template) == ("tekken", "mistral")
    assert (profile.per_message_tokens, profile.priming_tokens) == (2, 1)
    budget = Budget.for_model("mistral-nemo-instruct-2407")
    assert (budget.chat_template, budget.tokenizer) == ("mistral", "tekken")
    assert BudgetSettings.of(budget).budget().chat_template == "mistral"
    assert Budget.for_model("qwen3.5-27b").chat_template == "messages"


def test_budget_settings_saved_before_the_chat_template_field_still_load() -> None:
    old = {"context_window": 8000, "tokenizer": "tekken"}
    assert cattrs.structure(old, BudgetSettings).budget().chat_template == "messages"


_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def test_llama_3_2_date_line_counts_the_same_every_day() -> None:
    """Llama 3.2's template writes today's date ("%d %b %Y"): every day counts alike, so its
    profile's fixed priming (the 3.1 framing) holds on any day."""
    counter = TokenCounter("llama3")
    day = datetime.date(2020, 1, 1)
    counts = set()
    while day.year < 2100:
        date = f"{day.day:02d} {_MONTHS[day.month - 1]} {day.year}"
        counts.add(counter.count(f"Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"))
        day += datetime.timedelta(days=1)
    assert counts == {20}
    assert get_profile("llama-3.2-3b-instruct").priming_tokens == 5 + 20


@pytest.mark.parametrize(
    ("name", "provider"),
    [
        ("claude-3-7-sonnet-20250219", "anthropic"),
        ("gpt-4.5-preview", "openai"),
        ("o1-mini", "openai"),
        ("gemini-1.5-pro-002", "gemini"),
        ("anthropic/some-proxy-name", "anthropic"),
        ("qwen2.5-7b-instruct", "openai"),
        ("my-local-model", None),
    ],
)
def test_provider_of_reads_the_name(name: str, provider: str | None) -> None:
    assert provider_of(name) == provider


def test_generic_profiles_follow_the_providers_rules() -> None:
    assert generic_profile("gpt-4.5-preview", "openai").tokenizer == "o200k_base"
    assert generic_profile("gpt-4-turbo", "openai").tokenizer == "cl100k_base"
    claude = generic_profile("claude-3-7-sonnet-20250219", "anthropic")
    assert (claude.exact_tokens, claude.safety_margin, claude.min_cacheable_tokens) == (
        False,
        0.30,
        1024,
    )
    assert generic_profile("claude-3-haiku-20240307", "anthropic").min_cacheable_tokens == 2048
    with pytest.raises(ConfigError, match="unknown provider 'mistral'"):
        generic_profile("x", "mistral")


@pytest.mark.parametrize(
    ("name", "read", "weight"),
    [
        ("gpt-4o", 0.5, 0.5),
        ("gpt-4.1-mini", 0.25, 0.75),
        ("o4-mini", 0.25, 0.75),
        ("gpt-5", 0.1, 0.9),
        ("claude-sonnet-4-5", 0.1, 1.15),
        ("gemini-2.5-pro", 0.1, 0.9),
        ("qwen3-8b", 0.1, 0.9),
    ],
)
def test_the_budget_prices_a_lost_cached_token_at_what_sending_it_again_costs_more(
    name: str, read: float, weight: float
) -> None:
    """A profile says what a cached token costs to read and to write (shares of the input
    price); the budget of the model prices each cached token a change loses at what
    sending it again costs beyond reading it (Anthropic writes it again at 1.25x), and a
    budget without a model at the current models' discount (a tenth of the price)."""
    profile = get_profile(name)
    assert profile.cache_read == read
    assert profile.cache_write == (1.25 if profile.provider == "anthropic" else 1.0)
    assert Budget.for_model(name).cache_weight == pytest.approx(weight)
    assert Budget.for_model(name, cache_weight=0.3).cache_weight == 0.3
    assert generic_profile("gpt-4o-audio", "openai").cache_read == 0.5
    assert Budget(8000).cache_weight == 0.9
    with pytest.raises(ConfigError, match=r"cache_read must be in \[0, 1\], got 1.5"):
        get_profile(name, cache_read=1.5)
    with pytest.raises(ConfigError, match="cache_write must be >= 1, got 0.5"):
        get_profile(name, cache_write=0.5)
