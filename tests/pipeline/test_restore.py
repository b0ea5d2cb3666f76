"""Reversible cuts: a cut library entry comes back when room frees up, cuts go only as
deep as they must, and a re-attached item is never a reference to a stub."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina import Conversation, load_conversation
from lamina.pipeline import Budget, DecisionAction, Envelope, Form, check_envelope
from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn
from lamina.processors import note
from lamina.renderers import openai_messages
from tests.pipeline.test_budget import exact_request_tokens

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vault"
SMALL = Budget(3000, reserve_output=400)
CUTS = {
    DecisionAction.COMPACTED,
    DecisionAction.EVICTED,
    DecisionAction.NOT_SENT,
    DecisionAction.HISTORY_CUT,
    DecisionAction.SHORTENED,
    DecisionAction.EXCERPTED,
    DecisionAction.INDEXED,
}


def _l2(env: Envelope) -> dict[str, Form]:
    return {s.key: s.form for s in env.l2.segments}


def _turn(conv: Conversation, text: str, *keys: str) -> Envelope:
    env = conv.turn(text, [note(k) for k in keys])
    assert exact_request_tokens(env) == env.report.budget.used <= SMALL.limit  # type: ignore[union-attr]
    conv.reply("Noted.")
    return env


def test_a_new_attachment_is_cut_before_the_cached_library_and_nothing_comes_back_twice() -> None:
    """examples/vault at 3000/400: the API notes do not fit whole beside the spec; the
    objective cuts them to a preview rather than the spec the cached prefix holds (a cut
    there would break it); the spec attached again refers to its whole library entry
    (not sent again beside it), and the next turn changes nothing."""
    conv = Conversation("You answer.", vault=EXAMPLE, budget=SMALL)
    first = _turn(conv, "The spec.", "project-spec.md")
    assert [s.form for s in first.l3.segments] == [Form.FULL]
    second = _turn(conv, "The API notes.", "docs/api-docs.md")
    check_envelope(second, first)
    assert _l2(second)["note:project-spec.md"] is Form.FULL
    assert [s.form for s in second.l3.segments] == [Form.PREVIEW]
    assert second.system_text.startswith(first.system_text)
    third = _turn(conv, "The spec again.", "project-spec.md")
    check_envelope(third, second)
    assert _l2(third)["note:project-spec.md"] is Form.FULL
    assert [s.form for s in third.l3.segments] == [Form.REFERENCE]
    fourth = _turn(conv, "And?")
    check_envelope(fourth, third)
    assert fourth.report.decisions == ()


def test_a_reattached_item_is_never_a_reference_to_a_stub() -> None:
    """Re-attaching the spec with two other items at 3000/400: the spec stays whole in the
    library and is referred to, and the other items share what is left."""
    conv = Conversation("You answer.", vault=EXAMPLE, budget=SMALL)
    first = _turn(conv, "The spec.", "project-spec.md")
    env = _turn(conv, "All three.", "project-spec.md", "docs/api-docs.md", "docs/auth.md")
    check_envelope(env, first)
    l3 = {s.key: s for s in env.l3.segments}
    spec = l3["note:project-spec.md"]
    assert spec.form is Form.REFERENCE and not spec.unsent
    assert _l2(env)["note:project-spec.md"] is Form.FULL
    assert l3["note:docs/api-docs.md"].form is Form.PREVIEW


def test_the_last_resort_lists_a_reattached_item_as_not_sent() -> None:
    """When even the re-attached entry must be cut, the item is listed as not sent."""
    budget = Budget(1500, reserve_output=100)
    conv = Conversation("You answer.", vault=EXAMPLE, budget=budget)
    conv.turn("The spec.", [note("project-spec.md")])
    conv.reply("Noted.")
    env = conv.turn("Spec and API.", [note("project-spec.md"), note("docs/api-docs.md")])
    check_envelope(env)
    spec = next(s for s in env.l3.segments if s.key == "note:project-spec.md")
    entry = next(s for s in env.l2.segments if s.key == "note:project-spec.md")
    assert spec.form is not Form.REFERENCE or entry.form is Form.FULL or spec.unsent


def _transcript(minutes: int) -> str:
    lines = ["# All-hands recording", ""]
    for m in range(minutes):
        lines.append(f"## {m // 60:02d}:{m % 60:02d}")
        lines.append("")
        lines.append(
            " ".join(
                f"Speaker {s % 4} said item {m}.{s} about the rollout of the sync service "
                f"and the migration plan for region {m % 7}."
                for s in range(8)
            )
        )
        lines.append("")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def big_vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bigvault")
    for i in range(22):
        body = "\n\n".join(
            f"## Part {p}\n\n"
            + " ".join(f"Note {i} part {p} fact {k} on sample store {i}." for k in range(14))
            for p in range(4)
        )
        (root / f"n{i:02d}.md").write_text(f"# Note {i}\n\n{body}\n", encoding="utf-8")
    (root / "transcript.md").write_text(_transcript(120), encoding="utf-8")
    return root


def test_a_large_attachment_leaves_the_library_its_floor_and_stays_in_the_batch(
    big_vault: Path,
) -> None:
    """A 2-hour transcript arriving in a chat with a 22-note library at 16k: the library
    keeps text (not all stubs), and the transcript's preview enters the library in its
    carry-forward form. The preview as its turn sent it stays in that turn's message of
    the batch, so the short turns after extend the batch: the model still reads all of
    it, and nothing is restored or sent again. (While a kept or restoring request did not
    see what the batch carries, the short turn gave the transcript's entry back to the
    size its turn sent, a second copy, and its batch settled; while a note's whole counted
    in its value beyond the limit, the transcript's turn cut 11 of the library's 12 whole
    entries, now 7.)"""
    budget = Budget(16_000, reserve_output=2_000)
    conv = Conversation("You answer.", vault=big_vault, budget=budget)
    previous: Envelope | None = None
    for start in range(0, 22, 4):
        keys = [f"n{i:02d}.md" for i in range(start, min(start + 4, 22))]
        previous = conv.turn(f"Notes from {start}.", [note(k) for k in keys])
        conv.reply("Read.")
    assert previous is not None
    held = {e.key for e in conv.library} | {f.key for e in conv.library for f in e.folded}
    assert {f"note:n{i:02d}.md" for i in range(22)} <= held  # some set aside, in an index
    big = conv.turn("The recording.", [note("transcript.md")])
    check_envelope(big, previous)
    conv.reply("Heard.")
    library = [s for s in big.l2.segments if s.key != "note:transcript.md"]
    assert any(s.form is not Form.REFERENCE for s in library)
    sent = next(s for s in big.l3.segments if s.key == "note:transcript.md")
    assert sent.form is Form.PREVIEW
    # The transcript's preview enters L2 in carry-forward form, not as its 6k-token cut.
    entry = conv.library.get("note:transcript.md")
    assert entry is not None and entry.tokens < 3_000 < sent.tokens
    first = conv.turn("What did we decide?")
    check_envelope(first, big)
    assert first.batch is not None and first.batch.reason == ""  # extends the batch
    assert not first.report.decisions
    assert any(sent.text in m["content"] for m in openai_messages(first))
    assert exact_request_tokens(first) == first.report.budget.used <= budget.limit  # type: ignore[union-attr]
    conv.reply("Two things.")
    after = conv.turn("And the third?")
    check_envelope(after, first)
    assert not after.report.decisions  # the prefix is kept


NOTES = (
    "project-spec.md",
    "docs/api-docs.md",
    "docs/auth.md",
    "glossary.md",
    "meetings/2026-10-19.md",
    "meetings/2026-11-02.md",
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(st.lists(st.sampled_from(NOTES), max_size=3), min_size=4, max_size=12),
    window=st.integers(min_value=1800, max_value=6000),
)
def test_cuts_are_states_over_random_chats(turns: list[list[str]], window: int) -> None:
    """Over random attachment sequences: the invariants hold (no reference to a stub among
    them) and counts are exact. (What is left cut while it would fit is the judge's
    finding, measured on whole chats in tests/test_real_material.py.)"""
    budget = Budget(window, reserve_output=window // 6)
    conv = Conversation("You answer.", vault=EXAMPLE, budget=budget)
    previous: Envelope | None = None
    for i, keys in enumerate(turns):
        env = conv.turn(f"Question {i}.", [note(k) for k in keys])
        report = env.report.budget
        assert report is not None
        check_envelope(env, previous)
        assert exact_request_tokens(env) == report.used <= budget.limit
        conv.reply("Noted.")
        previous = env


def test_stubs_folded_into_a_library_index_survive_a_store(
    tmp_path: Path,
) -> None:
    """A documentation vault at 5,250: by turn 9 small library entries are folded into
    their folders' indexes (``LibraryEntry.folded`` keeps them); a conversation restored
    from SQLite holds the same library and decides the next turn byte for byte the same.
    (At 8k the budget now cuts the library to previews there and folds nothing; at 5k,
    since a copy in L3 is valued by what it adds to the library's, the re-attached note
    cuts nothing and nothing is folded by turn 9; at 5.5k, since a folder's index head is
    fixed once a round sends it, neither.)"""
    from tests.test_real_material import KEPANO, KEPANO_CHAT

    budget = Budget(5250, reserve_output=1000)
    live = Conversation("You answer from the attached notes.", vault=KEPANO, budget=budget)
    previous: Envelope | None = None
    with SqliteStore(tmp_path / "chat.db") as store:
        store.create(ConversationInfo("c"))
        for i, (query, attach) in enumerate(KEPANO_CHAT[:9]):
            env = live.turn(query, attach)
            check_envelope(env, previous)
            live.reply(f"Answer {i + 1}.")
            save_turn(store, "c", live, env)
            previous = env
        folded = [e for e in live.library if e.folded]
        assert folded, "turn 9 folds the library's stubs into indexes"
        # Those not in the library again on their own (a note re-attached at turn 9).
        listed = {f.key for e in folded for f in e.folded} - {e.key for e in live.library}
        again = load_conversation(store, "c", vault=KEPANO)
    assert again.library == live.library
    want, got = live.turn("And now?"), again.turn("And now?")
    check_envelope(want, previous)
    assert got.system_text == want.system_text and got.report == want.report
    assert listed  # entries folded away that only their indexes name


def test_a_reattached_long_note_cuts_the_library_no_deeper_than_it_needs() -> None:
    """The documentation vault at 6k: turn 9 re-attaches a 2,277-token note the library
    holds as its 593-token preview. A copy in L3 tells the model only what it adds to the
    library's, so the item refers to the library's preview (the reference names the form)
    and the library of ~100 small notes is not cut for a copy (one 62-token entry goes to
    its count), not to its stubs' index: the turn uses most of its limit. (Before copies
    were valued by what they add, L3 sent a preview of the note beside the library's and
    the library was cut for it, entries compacted and one listed in an index. At 8k a
    turn with room gave the note back whole before turn 9: the re-attachment is then a
    reference and cuts nothing.)"""
    from tests.test_real_material import KEPANO, KEPANO_CHAT

    budget = Budget(6000, reserve_output=1000)
    conv = Conversation("You answer from the attached notes.", vault=KEPANO, budget=budget)
    previous: Envelope | None = None
    key = "note:Clippings/68 Bits of Unsolicited Advice.md"
    held = None
    for i, (query, attach) in enumerate(KEPANO_CHAT[:9]):
        held = conv.library.get(key)
        env = conv.turn(query, attach)
        check_envelope(env, previous)
        conv.reply(f"Answer {i + 1}.")
        previous = env
    assert held is not None and held.form is Form.PREVIEW and held.cut
    assert previous is not None and previous.report.budget is not None
    report = previous.report.budget
    assert report.used >= 0.9 * report.limit
    assert previous.l2.tokens > 4_000
    actions = [d.action for d in report.decisions]
    assert set(actions) <= {
        DecisionAction.COMPACTED, DecisionAction.INDEXED, DecisionAction.REFERENCED
    }
    assert actions.count(DecisionAction.COMPACTED) + actions.count(DecisionAction.INDEXED) <= 1
    sent = previous.l3.get(key)
    assert sent is not None and sent.form is Form.REFERENCE and 'library="preview"' in sent.text
    assert held.text in previous.system_text  # the preview the model reads


def test_a_chat_decides_the_same_whatever_the_process_summarized_before() -> None:
    """Library summaries are memoized by the body summarized: the public vault at 8k builds
    the same requests alone as after the same vault's chat at 4k in the same process,
    whose previews of the same notes differ (keyed by content alone, the 8k chat got the
    4k chat's summaries from the process's pool and cut differently from turn 6 on)."""
    from lamina.pipeline.views import summary_pool
    from tests.test_real_material import KEPANO, KEPANO_CHAT

    def chat(window: int, reserve: int) -> list[str]:
        conv = Conversation(
            "You answer from the attached notes.", vault=KEPANO, budget=Budget(window, reserve)
        )
        texts = []
        for i, (query, attach) in enumerate(KEPANO_CHAT[:10]):
            texts.append(conv.turn(query, attach).system_text)
            conv.reply(f"Answer {i + 1}: " + "the notes say several things about this. " * 8)
        return texts

    summary_pool().clear()
    alone = chat(8000, 1000)
    summary_pool().clear()
    chat(4000, 600)
    assert chat(8000, 1000) == alone


def test_the_regret_starts_over_when_nothing_is_cut(big_vault: Path) -> None:
    """A request that fits with nothing cut forgoes nothing: a regret carried from before
    is dropped (it could otherwise buy a later restore it never paid for), and it is part
    of the state a conversation is restored from."""
    conv = Conversation("You answer.", vault=big_vault, budget=Budget(16_000, 2_000))
    conv.turn("One note.", [note("n00.md")])
    conv.reply("Read.")
    state = attrs.evolve(conv.state, regret=500.0)
    again = Conversation.restore(state, vault=big_vault)
    assert again.state.regret == 500.0
    again.turn("What does it say?")
    assert not any(e.cut for e in again.library) and again.state.regret == 0.0
