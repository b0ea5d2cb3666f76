"""Model profiles as data (pipeline._tokens.profiles)."""

from __future__ import annotations

import pytest

from pipeline._errors import ConfigError
from pipeline._tokens.counter import TOKENIZERS
from pipeline._tokens.profiles import PROFILES, ModelProfile, get_profile


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
