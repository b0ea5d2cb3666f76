"""The request as sent, in Python: ``env.cache``, ``trace_document`` without a counter,
the bands and rows of a request, and the HTML report's view of them."""

from __future__ import annotations

from pathlib import Path

import lxml.html
import pytest

from lamina import Budget, Conversation, load_script, note, run_script
from lamina.pipeline import Envelope
from lamina.pipeline.tokens import TokenCounter
from lamina.renderers import (
    SENT_BANDS,
    render_report,
    report_blocks,
    sent_bands,
    sent_rows,
    trace_document,
)

ROOT = Path(__file__).resolve().parents[2]
VAULT = ROOT / "examples" / "vault"


@pytest.fixture(scope="module")
def chat() -> tuple[list[Envelope], Conversation]:
    """The first ten turns of examples/chat30.yaml at 6,000 tokens, the default layout."""
    script = load_script(ROOT / "examples" / "chat30.yaml")
    script = type(script)(script.path, script.system, script.turns[:10], VAULT)
    conv = Conversation(script.system, vault=VAULT, budget=Budget(context_window=6000,
                                                                  reserve_output=1500))
    return run_script(script, conv), conv


def test_env_cache_is_the_trace_turns_cache(chat: tuple[list[Envelope], Conversation]) -> None:
    """Each envelope's ``cache`` is its trace turn's, figure, code and sentence alike."""
    envelopes, conv = chat
    turns = trace_document(envelopes, conv.counter, budget=conv.budget)["turns"]
    for env, turn in zip(envelopes, turns, strict=True):
        assert env.cache is not None
        assert (env.cache.tokens, env.cache.total) == (
            turn["cache"]["common_prefix_tokens"],
            turn["tokens_total"],
        )
        assert (env.cache.reason, env.cache.sentence) == (
            turn["cache"]["break_reason"],
            turn["cache"]["sentence"],
        )
    assert envelopes[0].cache is not None and envelopes[0].cache.reason == "first-turn"
    assert any(e.cache is not None and e.cache.reason is None for e in envelopes)


def test_trace_document_needs_no_counter(chat: tuple[list[Envelope], Conversation]) -> None:
    """Without a counter it counts with o200k_base (the chat's tokenizer), and every turn
    has the ``cache`` key docs/TRACE.md lists."""
    envelopes, conv = chat
    assert conv.counter.name == "o200k_base"
    plain = trace_document(envelopes)
    counted = trace_document(envelopes, TokenCounter())
    assert plain == counted
    assert all(
        set(t["cache"]) == {"common_prefix_tokens", "break_reason", "sentence"}
        for t in plain["turns"]
    )


def test_a_trace_that_starts_mid_chat_takes_the_envelopes_cache(
    chat: tuple[list[Envelope], Conversation],
) -> None:
    envelopes, _ = chat
    later = envelopes[2]
    assert later.cache is not None
    (turn,) = trace_document([later])["turns"]
    assert turn["cache"]["common_prefix_tokens"] == later.cache.tokens
    assert turn["cache"]["break_reason"] == later.cache.reason
    bare = Envelope(later.turn, later.layers, later.report, batch=later.batch)
    (unknown,) = trace_document([bare])["turns"]
    assert unknown["cache"]["break_reason"] == "previous-not-rebuilt"


def test_a_restored_conversation_does_not_claim_a_first_request() -> None:
    conv = Conversation("You are terse.", vault=VAULT)
    conv.turn("Summarize this", attach=[note("project-spec.md")])
    conv.reply("A spec.")
    again = Conversation.restore(conv.state, vault=VAULT)
    env = again.turn("And the API?", attach=[note("docs/api-docs.md")])
    assert env.cache is not None and env.cache.reason == "previous-not-rebuilt"
    assert env.cache.tokens == 0 and "could not be rebuilt" in env.cache.sentence


def test_rows_and_bands_are_the_request_as_sent(
    chat: tuple[list[Envelope], Conversation],
) -> None:
    """The system message holds only the settled entries; deferred turns are rows of
    their own; each band's rows add up to at most the band (intros are framing or L3)."""
    envelopes, conv = chat
    deferred_seen = False
    for env in envelopes:
        total = conv.count_request(env)
        bands = sent_bands(env, total)
        assert tuple(bands) == SENT_BANDS and sum(bands.values()) == total
        rows = sent_rows(env)
        settled = env.l2.keys()[: env.batch.settled] if env.batch else env.l2.keys()
        assert [r.key for r in rows if r.band == "L2"] == list(settled)
        for band in SENT_BANDS[:-1]:
            counted = sum(r.tokens or 0 for r in rows if r.band == band)
            assert counted <= bands[band], (env.turn, band)
            if band != "L3":
                assert counted == bands[band], (env.turn, band)
        deferred_seen |= bands["deferred"] > 0
    assert deferred_seen


def test_the_report_draws_the_bands_and_lists_the_messages_as_sent(
    chat: tuple[list[Envelope], Conversation],
) -> None:
    envelopes, conv = chat
    trace = trace_document(envelopes, conv.counter, budget=conv.budget)
    page = lxml.html.document_fromstring(render_report(trace, report_blocks(envelopes)))
    for turn in trace["turns"]:
        bars = page.xpath(f"//g[@class='turn'][@data-turn='{turn['turn']}']/rect")
        drawn = {r.get("data-layer"): int(r.get("data-tokens")) for r in bars}
        assert drawn == {k: v for k, v in turn["sent"].items() if v > 0}
        section = page.xpath(f"//section[@id='turn-{turn['turn']}']")[0]
        roles = section.xpath(".//details[@class='messages']/ol/li/@data-role")
        assert roles[0] == "system" and roles[-1] == "user"
    two = page.xpath("//section[@id='turn-2']")[0].text_content()
    assert "Extends the request before: The request extends turn 1's" in two
    assert "Little cached" not in two
    assert "turn 1's message with the context it attached (deferred)" in two
