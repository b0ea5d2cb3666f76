"""The batched layout: the library layout with its growth deferred to the next break, as
cheap as append-only where nothing breaks and never over the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import Conversation, load_script, run_script
from pipeline import Budget, ConfigError, Envelope
from renderers import Simulation, build_prompt, prompt_prefix_tokens, prompt_tokens, simulate

ROOT = Path(__file__).resolve().parents[2]


def _chat30(window: int | None) -> tuple[list[Envelope], Conversation]:
    script = load_script(ROOT / "examples" / "chat30.yaml")
    budget = None if window is None else Budget(context_window=window, reserve_output=window // 4)
    conv = Conversation(script.system, vault=script.vault, budget=budget)
    return run_script(script, conv), conv


@pytest.fixture(scope="module")
def chat30() -> tuple[list[Envelope], Conversation, Simulation]:
    envs, conv = _chat30(None)
    return envs, conv, simulate(envs, counter=conv.counter, providers=["openai", "anthropic"])


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_batched_is_as_cheap_as_append_only_on_chat30(
    chat30: tuple[list[Envelope], Conversation, Simulation], provider: str
) -> None:
    sim = chat30[2]
    batched, append = sim.get("batched", provider), sim.get("append-only", provider)
    assert batched.cost <= append.cost
    assert batched.cost < sim.get("default", provider).cost


@pytest.mark.xfail(
    strict=False,
    reason="the library layout re-sends history after every library growth: chat30 "
    "measured 0.347 vs 0.293 of uncached (OpenAI), 0.229 vs 0.159 (Anthropic); the "
    "batched layout meets it",
)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_default_layout_is_not_costlier_than_append_only_on_chat30(
    chat30: tuple[list[Envelope], Conversation, Simulation], provider: str
) -> None:
    sim = chat30[2]
    assert sim.get("default", provider).cost <= sim.get("append-only", provider).cost


def test_without_a_break_each_batched_request_extends_the_one_before(
    chat30: tuple[list[Envelope], Conversation, Simulation],
) -> None:
    envs, conv, _ = chat30
    previous = build_prompt(envs[:1], "batched", conv.counter)
    assert previous.chat() == build_prompt(envs[:1], "default").chat()
    for i in range(2, len(envs) + 1):
        prompt = build_prompt(envs[:i], "batched", conv.counter)
        whole = prompt_tokens(previous, conv.counter) - 3  # all but the reply's priming
        assert prompt_prefix_tokens(previous, prompt, conv.counter) == whole
        previous = prompt


@pytest.mark.parametrize("window", [6000, 16000])
def test_batched_fits_the_budget_and_costs_no_more_than_the_default(window: int) -> None:
    """Append-only ignores the budget (at 6,000 it is over the limit in 22 of 30 turns);
    batched settles as built before it would not fit."""
    envs, conv = _chat30(window)
    for i, env in enumerate(envs):
        assert env.report.budget is not None
        prompt = build_prompt(envs[: i + 1], "batched", conv.counter)
        assert prompt_tokens(prompt, conv.counter, conv.budget) <= env.report.budget.limit
    sim = simulate(envs, counter=conv.counter, providers=["openai"], budget=conv.budget)
    assert sim.get("batched", "openai").cost <= sim.get("default", "openai").cost


def test_batched_needs_the_conversations_counter(
    chat30: tuple[list[Envelope], Conversation, Simulation],
) -> None:
    with pytest.raises(ConfigError, match="counter"):
        build_prompt(chat30[0], "batched")
