"""One unit for every cache figure: the request's own count (``request_tokens``), in which
the cached prefix is part of the request and never above it, whatever the layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina import Conversation, load_script, run_script
from lamina.pipeline import Budget, DecisionAction, Envelope
from lamina.pipeline.tokens import TokenCounter, request_tokens
from lamina.renderers import (
    LAYOUTS,
    Block,
    Message,
    Prompt,
    annotate_trace,
    build_prompt,
    prefix_reports,
    prompt_prefix_tokens,
    prompt_tokens,
    trace_document,
)
from lamina.renderers._layouts import default_prompt
from tests.cli import lamina_here

ROOT = Path(__file__).resolve().parents[2]
CHAT30 = ROOT / "examples" / "chat30.yaml"


@pytest.fixture(scope="module")
def chat30() -> tuple[list[Envelope], Conversation]:
    """examples/chat30.yaml under a 6,000-token window, as ``lamina run --window 6000``."""
    script = load_script(CHAT30)
    conv = Conversation(
        script.system,
        vault=script.vault,
        budget=Budget(context_window=6000, reserve_output=1500),
    )
    return run_script(script, conv), conv


def test_default_prompt_is_counted_as_the_request(
    chat30: tuple[list[Envelope], Conversation],
) -> None:
    envs, conv = chat30
    for env in envs:
        assert prompt_tokens(default_prompt(env), conv.counter) == request_tokens(env, conv.counter)
        assert prompt_tokens(default_prompt(env), conv.counter, conv.budget) == (
            conv.count_request(env)
        )


def test_the_cached_prefix_is_never_above_the_request(
    chat30: tuple[list[Envelope], Conversation],
) -> None:
    """Counted on ChatML text, 15 of these 30 turns showed a prefix over the request
    (turn 30: 3,396 of a 2,901-token request)."""
    envs, conv = chat30
    reports = prefix_reports(envs, conv.counter, budget=conv.budget)
    for env, report in zip(envs, reports, strict=True):
        assert report.common_prefix_tokens <= conv.count_request(env)
    # The last turn whose library no budget decision changed (a cut or a restore rewrites
    # the system message from that entry on) and that does not settle deferred context (the
    # deferred turns' messages lose theirs), after a turn that recalled and sent again
    # nothing (recalled passages and blocks sent again beside a cut entry are that turn's
    # only), repeats nearly all of its request.
    i = max(
        i
        for i, env in enumerate(envs)
        if i and not _budget_changed(env) and not _settles(env) and not _scoped(envs[i - 1])
    )
    last = reports[i].common_prefix_tokens
    assert 0.9 * conv.count_request(envs[i]) < last <= conv.count_request(envs[i])


def _library_changed(env: Envelope) -> bool:
    return any(d.layer == "L2" for d in env.report.decisions)


def _recalled(env: Envelope) -> bool:
    """The turn's message held recalled passages (not carried into later requests)."""
    return any(s.source_type == "recalled" for s in env.l3.segments)


def _scoped(env: Envelope) -> bool:
    """The turn's message held recalled passages or a block sent again beside its cut
    library entry (neither is carried into later requests under the default layout)."""
    resent = any(d.action is DecisionAction.RESENT for d in env.report.decisions)
    return resent or _recalled(env)


def _settles(env: Envelope) -> bool:
    """The request settles the library's deferred growth (``Batch.reason``)."""
    return env.batch is not None and env.batch.reason != ""


def _budget_changed(env: Envelope) -> bool:
    """A budget decision rewrote the library or moved the history cut."""
    return _library_changed(env) or any(
        d.action is DecisionAction.HISTORY_CUT for d in env.report.decisions
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_is_counted_in_the_same_unit(
    chat30: tuple[list[Envelope], Conversation], layout: str
) -> None:
    """A request that repeats the previous one whole shares all of its messages, framing
    included, and the prefix never passes the request."""
    envs, conv = chat30
    previous = None
    for i in range(len(envs)):
        prompt = build_prompt(envs[: i + 1], layout, conv.counter)  # type: ignore[arg-type]
        total = prompt_tokens(prompt, conv.counter)
        shared = prompt_prefix_tokens(previous, prompt, conv.counter)
        assert 0 <= shared <= total
        previous = prompt
    # append-only: each request extends the one before it by whole messages, but for the
    # recalled passages of the turn before, which its message leaves behind (the last turn
    # no budget decision changed: a cut or a restore rewrites the prefix from there on).
    if layout == "append-only":
        i = max(i for i, env in enumerate(envs) if i and not _budget_changed(env))
        before = build_prompt(envs[:i], "append-only")
        after = build_prompt(envs[: i + 1], "append-only")
        shared = prompt_prefix_tokens(before, after, conv.counter)
        if not _recalled(envs[i - 1]):
            assert shared == prompt_tokens(before, conv.counter) - 3  # all but the priming
        else:
            earlier = attrs.evolve(before, messages=before.messages[:-1])
            # (all of the messages before it; its message may open with the passages)
            assert prompt_tokens(earlier, conv.counter) - 3 <= shared
            assert shared < prompt_tokens(before, conv.counter) - 3


_text = st.text(alphabet=st.sampled_from("ab <>/\n\tx.é"), max_size=40)
_blocks = st.lists(st.one_of(_text, _text.map(lambda t: "<note>" + t)), min_size=1, max_size=4)


def _prompt(system: list[str], messages: list[list[str]]) -> Prompt:
    roles = ("user", "assistant")
    return Prompt(
        "default",
        1,
        tuple(Block(t) for t in system if t),
        tuple(
            Message(roles[i % 2], tuple(Block(t) for t in blocks))
            for i, blocks in enumerate(messages)
        ),
    )


@settings(max_examples=150, deadline=None)
@given(
    system=_blocks,
    shared=st.lists(_blocks, max_size=3),
    first=st.lists(_blocks, min_size=1, max_size=2),
    second=st.lists(_blocks, min_size=1, max_size=2),
)
def test_prefix_is_exact_and_bounded(
    system: list[str], shared: list[list[str]], first: list[list[str]], second: list[list[str]]
) -> None:
    """Property: the prefix is at most the request, a request repeated whole shares every
    message with its framing, and the shared tokens are exactly the encoded prefix."""
    counter = TokenCounter()
    a, b = _prompt(system, shared + first), _prompt(system, shared + second)
    assert prompt_prefix_tokens(a, b, counter) <= prompt_tokens(b, counter)
    assert prompt_prefix_tokens(a, a, counter) == prompt_tokens(a, counter) - 3
    assert prompt_tokens(a, counter) == 3 + sum(
        3 + len(counter.encode(text)) for _, text in a.chat()
    )


def test_mistral_prefix_is_the_history_only(chat30: tuple[list[Envelope], Conversation]) -> None:
    """Mistral's format opens the last user turn with the system text, so only ``<s>`` and
    the earlier turns repeat; the count is the budget's own."""
    envs, conv = chat30
    budget = Budget(context_window=6000, reserve_output=1500, chat_template="mistral")
    for env in envs[-3:]:
        assert prompt_tokens(default_prompt(env), conv.counter, budget) == budget.used(
            env, conv.counter
        )
    before, after = default_prompt(envs[-2]), default_prompt(envs[-1])
    shared = prompt_prefix_tokens(before, after, conv.counter, budget)
    history = envs[-2].as_sent().l4.segments  # deferred messages hold their context
    assert 0 < shared < sum(s.tokens for s in history) + 4 * len(history)


def test_annotated_trace_counts_a_layout_in_its_own_unit(
    chat30: tuple[list[Envelope], Conversation],
) -> None:
    envs, conv = chat30
    doc = annotate_trace(
        trace_document(envs, conv.counter), envs, conv.counter, layout="append-only"
    )
    assert doc["layout"] == "append-only"
    for i, turn in enumerate(doc["turns"]):
        prompt = build_prompt(envs[: i + 1], "append-only")
        assert turn["tokens_total"] == prompt_tokens(prompt, conv.counter)
        assert turn["cache"]["common_prefix_tokens"] <= turn["tokens_total"]
        # Append-only only grows here, but for what a budget cut rewrites (library entries,
        # or history when the library is at its floor) and the recalled passages of the
        # turn before, which its message leaves behind.
        assert (
            turn["cache"]["break_reason"] is None
            or _budget_changed(envs[i])
            or _recalled(envs[i - 1])
        )


def test_cli_run_shows_the_prefix_inside_the_request() -> None:
    """``lamina run examples/chat30.yaml --window 6000``: every turn's cached prefix is a
    part of the request it prints (in the trace too, uncapped), and no gap is waved away
    as "a little"."""
    ran = lamina_here("run", str(CHAT30), "--window", "6000")
    assert ran.returncode == 0, ran.stderr
    requests = [int(m) for m in re.findall(r"= (\d+) tokens sent", ran.stdout)]
    lines = re.findall(r"cached prefix: (\d+) of (\d+) tokens", ran.stdout)
    assert len(lines) == len(requests) == 30
    for (cached, total), request in zip(lines, requests, strict=True):
        assert int(cached) <= int(total) == request
    assert "a little" not in ran.stdout
    trace = json.loads(lamina_here("run", str(CHAT30), "--window", "6000", "--json").stdout)
    for turn, request in zip(trace["turns"], requests, strict=True):
        assert turn["tokens_total"] == request
        assert turn["cache"]["common_prefix_tokens"] <= request
