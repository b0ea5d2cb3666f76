"""The default layout defers the library's growth to the next break: as cheap as
append-only where nothing breaks, never over the budget, and the same requests as the
batched layout computes from the envelopes as built."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import Conversation, load_script, run_script
from lamina.pipeline import Budget, Envelope
from lamina.pipeline.errors import ConfigError
from lamina.renderers import Simulation, build_prompt, prompt_prefix_tokens, prompt_tokens, simulate

ROOT = Path(__file__).resolve().parents[2]


def _chat30(window: int | None, defer: bool = True) -> tuple[list[Envelope], Conversation]:
    script = load_script(ROOT / "examples" / "chat30.yaml")
    budget = None if window is None else Budget(context_window=window, reserve_output=window // 4)
    conv = Conversation(script.system, vault=script.vault, budget=budget, defer_library=defer)
    return run_script(script, conv), conv


@pytest.fixture(scope="module")
def chat30() -> tuple[list[Envelope], Conversation, Simulation]:
    envs, conv = _chat30(None)
    return envs, conv, simulate(envs, counter=conv.counter, providers=["openai", "anthropic"])


# Measured: the default (library growth deferred) equals append-only on chat30; growing the
# library every turn (defer_library=False) cost 0.345 (OpenAI) and 0.228 (Anthropic).
_CHAT30 = {"openai": (0.293, 0.345), "anthropic": (0.159, 0.228)}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_default_layout_is_as_cheap_as_append_only_on_chat30(
    chat30: tuple[list[Envelope], Conversation, Simulation], provider: str
) -> None:
    sim = chat30[2]
    default, append = sim.get("default", provider), sim.get("append-only", provider)
    assert default.cost <= append.cost
    assert round(default.relative_cost, 3) == _CHAT30[provider][0]
    assert sim.get("batched", provider).cost == default.cost


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_deferring_the_library_is_cheaper_than_growing_it_every_turn(provider: str) -> None:
    envs, conv = _chat30(None, defer=False)
    sim = simulate(envs, counter=conv.counter, providers=[provider], layouts=("default",))
    assert round(sim.get("default", provider).relative_cost, 3) == _CHAT30[provider][1]


def test_the_conversations_batches_are_the_batched_layouts() -> None:
    """What the conversation decides turn by turn is what ``batched_prompt`` computes from
    the envelopes as built of the same chat. (Under a budget ``batched_prompt`` settles
    ``BATCH_MARGIN`` early, since it estimates; the conversation counts exactly.)"""
    deferred, _ = _chat30(None)
    built, conv = _chat30(None, defer=False)
    for i, env in enumerate(deferred):
        assert env.layers == built[i].layers
        want = build_prompt(built[: i + 1], "batched", conv.counter).chat()
        assert build_prompt([env], "default").chat() == want


@pytest.mark.parametrize(("window", "same"), [(6000, 11), (7000, 16), (8000, 26), (16000, 30)])
def test_under_a_budget_the_layers_are_the_same_until_the_budget_prices_the_deferral(
    window: int, same: int
) -> None:
    """The budget prices the cache of the request as sent: with the library's growth
    deferred, a cut of history re-sends that growth too, and the batch's earlier messages
    carry what the build does not hold, so the two conversations may choose differently
    once a turn cuts or its batch would pass the limit as sent: at 6,000 from turn 12
    (the deferred chat cuts two library entries where the other cuts history); at 7,000
    from turn 17, where the deferred chat's recalled passages leave free what its batch
    carries (taken up to the limit as built, they pushed the extension over it and the
    batch settled); at 8,000 from turn 27, where both recall passages and the deferred
    chat's leave free what its batch carries (from turn 14 before a copy in L3 was valued
    by what it adds to the library's: both cut the API docs it attaches again to a
    preview, the deferred chat's smaller). A budget that cuts nothing builds the same
    layers either way."""
    deferred, _ = _chat30(window)
    built, _ = _chat30(window, defer=False)
    assert [e.layers for e in deferred[:same]] == [e.layers for e in built[:same]]
    assert same == 30 or deferred[same].layers != built[same].layers


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
def test_the_default_fits_the_budget_and_costs_no_more_than_growing_the_library(
    window: int,
) -> None:
    """Append-only ignores the budget (at 6,000 it is over the limit in 22 of 30 turns);
    the default sheds its deferred growth from the first block the budget changed, or
    settles as built, before it would not fit. It costs less than growing the library
    every turn (OpenAI cost, in uncached input tokens' worth): at 6,000 45,010 against
    48,224 (6.7% less), at 16,000 46,961 against 51,809, since a shed that would keep less
    of the growth cached than it sends again settles instead (a growth kept deferred makes
    every later cut of history re-send all of it; before, 52,459 and 55,060 at 6,000).
    Not at every window: at 7,000 53,591 against 51,848 (3.4% more), at 8,000 55,015
    against 52,507, where the default sends more (138,551 input tokens against 135,656;
    152,263 against 145,051, 79.5% of the attachments against 74.1%), caches more of the
    judge's bound (95% against 93% and 94%) and leaves nothing cut that fits (the other
    8 and 13 entries)."""
    envs, conv = _chat30(window)
    for i, env in enumerate(envs):
        assert env.report.budget is not None
        prompt = build_prompt(envs[: i + 1], "batched", conv.counter)
        assert prompt_tokens(prompt, conv.counter, conv.budget) <= env.report.budget.limit
    built, _ = _chat30(window, defer=False)
    sim = simulate(envs, counter=conv.counter, providers=["openai"], budget=conv.budget)
    before = simulate(built, counter=conv.counter, providers=["openai"], budget=conv.budget)
    assert sim.get("default", "openai").cost <= before.get("default", "openai").cost


def test_restoring_by_appending_sends_cut_entries_whole_for_a_little_more() -> None:
    """At 5,250 the batch sends a cut entry whole again where the request has room beyond
    the headroom (the meeting note of 19 October in turn 10); each goes once a batch and
    fits. (From 4,000 to 8,000 by 250, only 4,000 and 5,250 restore by appending since a
    copy in L3 is valued by what it adds to the library's; 4,000 to 4,500 did before,
    4,500 in turn 24.)"""
    envs, conv = _chat30(5250)
    again = [(e.turn, s.key) for e in envs if e.batch for s in e.batch.restored]
    assert again == [(10, "note:meetings/2026-10-19.md")]
    batch, sent = 0, set()
    for env in envs:
        assert env.report.budget is not None and env.batch is not None
        assert conv.budget is not None
        assert conv.budget.effective(env.batch.tokens) <= env.report.budget.limit
        batch += env.batch.reason != ""  # a settle starts a batch
        for seg in env.batch.restored:
            assert (batch, seg.key) not in sent
            sent.add((batch, seg.key))


def test_batched_needs_the_counter_only_for_envelopes_built_without_a_batch() -> None:
    envs, _ = _chat30(None, defer=False)
    with pytest.raises(ConfigError, match="counter"):
        build_prompt(envs[:3], "batched")
