"""``prefix_report`` renders and counts each request once per envelope, and reports exactly
what rendering and counting both requests whole reports (``reference_report``, the way it
was computed before, kept beside the benchmark that compares their cost)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from benchmarks.cache_report import reference_report
from lamina import Conversation, load_script, parse_script, run_script
from lamina.pipeline import Budget, Envelope
from lamina.pipeline.errors import BudgetExceeded
from lamina.pipeline.layout import QUERY_LABEL
from lamina.pipeline.tokens import TokenCounter
from lamina.processors import ProcessContext, Sources, Vault
from lamina.renderers import prefix_report, prefix_reports
from lamina.renderers._cache import _text_tokens
from tests.strategies import conversations, localize, serve_site, write_property_vault

ROOT = Path(__file__).resolve().parents[2]
CHAT30 = ROOT / "examples" / "chat30.yaml"

# Budgets with other framings: a lead and trimmed contents, Mistral's instruct format.
FRAMINGS = [
    None,
    {"per_message_tokens": 5, "priming_tokens": 4, "content_lead": "\n", "trim_content": True},
    {"per_message_tokens": 2, "priming_tokens": 1, "chat_template": "mistral"},
]


def _budgets(window: int | None) -> list[Budget | None]:
    out: list[Budget | None] = []
    for fields in FRAMINGS:
        if window is None and fields is None:
            out.append(None)
        else:
            out.append(
                Budget(context_window=window or 1_000_000, reserve_output=1500, **(fields or {}))
            )
    return out


def _assert_same(
    envs: Sequence[Envelope], counter: TokenCounter, budgets: list[Budget | None]
) -> None:
    for budget in budgets:
        expected = [
            reference_report(p, e, counter, budget=budget)
            for p, e in zip([None, *envs], envs, strict=False)
        ]
        # In order (each request the next one's previous, as a conversation reports) ...
        assert prefix_reports(envs, counter, budget=budget) == expected
        # ... and again, out of order and against other previous requests, from the memo.
        for i in reversed(range(len(envs))):
            assert (
                prefix_report(envs[i - 1] if i else None, envs[i], counter, budget=budget)
                == (expected[i])
            )
        if len(envs) > 2:
            assert prefix_report(envs[0], envs[-1], counter, budget=budget) == reference_report(
                envs[0], envs[-1], counter, budget=budget
            )


@pytest.fixture(scope="module")
def prop_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = write_property_vault(tmp_path_factory.mktemp("cachevault"))
    with serve_site(root / "site") as base:
        yield root, base


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    script=conversations,
    window=st.sampled_from([None, 2500, 6000]),
    defer=st.booleans(),
)
def test_the_report_is_the_reference_over_random_chats(
    script: dict[str, Any], window: int | None, defer: bool, prop_vault: tuple[Path, str]
) -> None:
    """With and without a budget (which settles batches early), with the library's growth
    deferred (batch extensions and settles) or grown every turn, under three framings."""
    root, base = prop_vault
    parsed = parse_script(localize(script, base), "generated")
    sources = Sources(context=ProcessContext(vault=Vault(root), allow_private_network=True))
    budget = Budget(context_window=window, reserve_output=1500) if window else None
    conv = Conversation(parsed.system, sources=sources, budget=budget, defer_library=defer)
    envs: list[Envelope] = []
    for turn in parsed.turns:
        try:
            envs.append(conv.turn(turn.user, turn.attach, vault_changes=dict(turn.vault_changes)))
        except BudgetExceeded:  # a turn that cannot fit ends the conversation here
            break
        if turn.reply is not None:
            conv.reply(turn.reply)
    for env in envs[1:]:
        event("extends" if env.batch is not None and not env.batch.reason else "settles or built")
    _assert_same(envs, conv.counter, _budgets(window))


@pytest.mark.parametrize("window", [None, 3000, 6000])
def test_the_report_is_the_reference_on_chat30(window: int | None) -> None:
    script = load_script(CHAT30)
    budget = Budget(context_window=window, reserve_output=1500) if window else None
    conv = Conversation(script.system, vault=script.vault, budget=budget)
    envs = run_script(script, conv)
    assert any(e.batch is not None and not e.batch.reason for e in envs[1:])  # extensions
    _assert_same(envs, conv.counter, _budgets(window))


def test_each_counter_counts_for_itself() -> None:
    """A report under another encoding does not reuse the first encoding's counts."""
    script = load_script(CHAT30)
    conv = Conversation(script.system, vault=script.vault)
    envs = run_script(script, conv)[:6]
    other = TokenCounter("cl100k_base")
    first = prefix_reports(envs, conv.counter)
    second = prefix_reports(envs, other)
    assert second == [
        reference_report(p, e, other) for p, e in zip([None, *envs], envs, strict=False)
    ]
    assert [r.common_prefix_tokens for r in first] != [r.common_prefix_tokens for r in second]


@given(
    st.lists(
        st.sampled_from(
            ["<a>x</a>", "<b k='1'>\n\n y\n</b>", "y", " z", "/p", "\n", "é", QUERY_LABEL + "q"]
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_message_counted_from_its_blocks_is_counted_exactly(blocks: list[str]) -> None:
    """Split at blocks and at the query label, the counts add up to the whole text's."""
    counter = TokenCounter()
    text = "\n\n".join(blocks)
    assert _text_tokens(text, counter) == counter.count_once(text)


def test_the_memo_lets_envelopes_go_and_hands_out_copies() -> None:
    """An envelope's entry goes with it; the trace's messages are the caller's to change."""
    import gc

    from lamina.renderers import trace_turn
    from lamina.renderers._cache import _MEMO
    from lamina.renderers._openai import openai_messages

    script = load_script(CHAT30)
    conv = Conversation(script.system, vault=script.vault)
    envs = run_script(script, conv)[:3]
    expected = openai_messages(envs[2])
    first = trace_turn(envs[2], conv.counter)["messages"]
    first[0]["content"] = "changed"
    first.clear()
    assert trace_turn(envs[2], conv.counter)["messages"] == expected
    prefix_reports(envs, conv.counter)
    keys = {id(e) for e in envs}
    assert keys <= set(_MEMO)
    del envs, first, conv
    gc.collect()
    assert not keys & set(_MEMO)
