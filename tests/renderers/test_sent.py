"""The request as sent, in Python: ``env.cache``, ``trace_document`` without a counter,
the bands and rows of a request, and the HTML report's view of them."""

from __future__ import annotations

from pathlib import Path

import lxml.html
import pytest

import lamina.pipeline
from lamina import (
    Budget,
    Conversation,
    load_conversation,
    load_script,
    note,
    run_script,
    stateless_turn,
)
from lamina.pipeline import Envelope
from lamina.pipeline.agent import AgentTurn
from lamina.pipeline.errors import ArgumentError
from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn
from lamina.pipeline.tokens import TokenCounter
from lamina.processors import Sources
from lamina.renderers import (
    SENT_BANDS,
    XmlRenderer,
    cached_prefix,
    listed_segments,
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


def test_the_core_conversation_measures_the_cache_with_a_meter() -> None:
    """``lamina.pipeline.Conversation`` gives ``env.cache`` when given a ``CacheMeter``
    (the figure ``lamina.Conversation`` gives), and None without one: the core lays out
    no request to compare."""
    host = Conversation("You are terse.", vault=VAULT)
    edges = {"sources": Sources.for_vault(VAULT), "renderer": XmlRenderer()}
    core = lamina.pipeline.Conversation("You are terse.", cache_meter=cached_prefix, **edges)
    bare = lamina.pipeline.Conversation("You are terse.", **edges)
    for conv in (host, core, bare):
        conv.turn("Summarize this", attach=[note("project-spec.md")])
        conv.reply("A spec.")
    turns = [c.turn("And the API?", attach=[note("docs/api-docs.md")]) for c in (host, core)]
    assert turns[0].cache is not None and turns[0].cache.tokens > 0
    assert turns[0].cache == turns[1].cache
    assert bare.turn("And the API?", attach=[note("docs/api-docs.md")]).cache is None
    with pytest.raises(ArgumentError, match="cache_meter"):
        lamina.pipeline.Conversation("s", cache_meter="yes")  # type: ignore[arg-type]


def test_a_loaded_conversation_measures_against_the_request_it_saved(tmp_path: Path) -> None:
    """``load_conversation`` and ``stateless_turn`` give the figure a conversation kept in
    memory gives: the stored last request is rebuilt as sent when the figure is read."""
    live = Conversation("You are terse.", vault=VAULT)
    attach = [note("project-spec.md")]
    with SqliteStore(tmp_path / "s.db") as store:
        store.create(ConversationInfo("c"))
        start = Conversation("You are terse.", vault=VAULT)
        conv, first = stateless_turn(store, "c", "Summarize this", attach, vault=VAULT, start=start)
        conv.reply("A spec.")
        save_turn(store, "c", conv, first, attach)
        live.turn("Summarize this", attach=attach)
        live.reply("A spec.")
        expected = live.turn("And the API?", attach=[note("docs/api-docs.md")]).cache
        _, second = stateless_turn(
            store, "c", "And the API?", [note("docs/api-docs.md")], vault=VAULT
        )
        loaded = load_conversation(store, "c", turn=1, vault=VAULT)
        again = loaded.turn("And the API?", attach=[note("docs/api-docs.md")])
        assert first.cache is not None and first.cache.reason == "first-turn"
        assert expected is not None and expected.tokens > 0
        assert second.cache == expected
        assert again.cache == expected


def test_an_agent_turn_s_envelope_has_its_cache() -> None:
    """The first request of an agent loop's turn is measured like a plain turn's."""
    conv = Conversation("You are terse.", vault=VAULT)
    conv.turn("Summarize this", attach=[note("project-spec.md")])
    conv.reply("A spec.")
    before = conv._sent
    agent = AgentTurn.start(conv, "What changed?", [note("docs/api-docs.md")])
    assert isinstance(before, Envelope)
    assert agent.envelope.cache == cached_prefix(before, conv._sent, conv.counter)
    assert agent.envelope.cache is not None and agent.envelope.cache.tokens > 0


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


def test_an_entry_set_aside_is_neither_listed_nor_counted() -> None:
    """chat30 at 5,000: by turn 15 the library keeps its index of entries set aside for
    room, which has no text and sends no byte; the rows, the trace's layers, stats and
    batch, and the report's system message list and count only the seven entries the
    system message holds (they said 8 of 8, the set-aside index counted as an entry)."""
    script = load_script(ROOT / "examples" / "chat30.yaml")
    script = type(script)(script.path, script.system, script.turns[:15], VAULT)
    conv = Conversation(script.system, vault=VAULT, budget=Budget(context_window=5000))
    envelopes = run_script(script, conv)
    env = envelopes[-1]
    assert [s.key for s in env.l2.segments if not s.text] == ["index:earlier turns"]
    sent = [s.key for s in listed_segments(env.l2)]
    assert len(sent) == 7 and "index:earlier turns" not in sent
    assert [r.key for r in sent_rows(env) if r.band == "L2"] == sent
    turn = trace_document(envelopes, conv.counter, budget=conv.budget)["turns"][-1]
    assert [s["key"] for s in turn["layers"]["L2"]["segments"]] == sent
    assert turn["stats"]["segments"]["L2"] == 7 and turn["batch"]["settled_entries"] == 7
    page = lxml.html.document_fromstring(render_report({"turns": [turn]}, {}))
    assert "L1 and the library (7 of 7 entries)" in page.text_content()
