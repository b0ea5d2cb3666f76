"""Reversible cuts and the budget plan: a cut library entry comes back when room frees up,
cuts go only as deep as they must, the library and history keep their floors, and a
re-attached item is never a reference to a stub."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina import Conversation, load_conversation
from lamina.pipeline import Budget, Decision, DecisionAction, Envelope, Form, check_envelope
from lamina.pipeline.budget import BudgetPlan
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn
from lamina.processors import note
from lamina.renderers import trace_document
from tests.pipeline.test_budget import exact_request_tokens

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vault"
SMALL = Budget(3000, reserve_output=400)
# The cascade (``policy="current-first"``), kept until it is deleted: the tests of its
# restore schedule, floors and slack run on it.
CASCADE = Budget(3000, reserve_output=400, policy="current-first")
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


def test_a_cut_goes_no_deeper_than_needed_and_comes_back_when_room_frees() -> None:
    """examples/vault at 3000/400: the API notes cut the spec to a preview (it fits), not
    to a summary; the spec attached again, in a turn that must cut anyway, comes back
    whole in the library and the item refers to it (not sent again in L3 beside its
    preview); the next turn keeps it so, without a cut or a restore."""
    conv = Conversation("You answer.", vault=EXAMPLE, budget=CASCADE)
    first = _turn(conv, "The spec.", "project-spec.md")
    assert [s.form for s in first.l3.segments] == [Form.FULL]
    second = _turn(conv, "The API notes.", "docs/api-docs.md")
    check_envelope(second, first)
    assert _l2(second)["note:project-spec.md"] is Form.PREVIEW
    third = _turn(conv, "The spec again.", "project-spec.md")
    check_envelope(third, second)
    assert _l2(third)["note:project-spec.md"] is Form.FULL
    assert [s.form for s in third.l3.segments] == [Form.REFERENCE]
    restored = [d for d in third.report.decisions if d.action is DecisionAction.RESTORED]
    assert [(d.target, d.to_form.value, d.layer.value) for d in restored] == [
        ("note:project-spec.md", "full", "L2")
    ]
    fourth = _turn(conv, "Which milestone is next?")
    check_envelope(fourth, third)
    assert _l2(fourth)["note:project-spec.md"] is Form.FULL
    assert fourth.report.decisions == ()
    assert fourth.system_text == third.system_text
    assert conv.library.get("note:project-spec.md").whole is None  # type: ignore[union-attr]


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
    budget = Budget(1500, reserve_output=100, plan=BudgetPlan(library_floor=0.0))
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


def test_a_large_attachment_leaves_the_library_its_floor_and_it_comes_back(
    big_vault: Path,
) -> None:
    """A 2-hour transcript arriving in a chat with a 22-entry library at 16k: the library
    keeps its floor (not all stubs), and the next short turn restores entries."""
    budget = Budget(16_000, reserve_output=2_000, policy="current-first")
    conv = Conversation("You answer.", vault=big_vault, budget=budget)
    previous: Envelope | None = None
    for start in range(0, 22, 4):
        keys = [f"n{i:02d}.md" for i in range(start, min(start + 4, 22))]
        previous = conv.turn(f"Notes from {start}.", [note(k) for k in keys])
        conv.reply("Read.")
    assert previous is not None and len(conv.library) == 22
    big = conv.turn("The recording.", [note("transcript.md")])
    check_envelope(big, previous)
    conv.reply("Heard.")
    library = [s for s in big.l2.segments if s.key != "note:transcript.md"]
    assert any(s.form is not Form.REFERENCE for s in library)
    assert sum(s.tokens for s in library) >= budget.limit * budget.plan.library_floor - 200
    assert next(s for s in big.l3.segments if s.key == "note:transcript.md").form is Form.PREVIEW
    # The transcript's preview enters L2 in carry-forward form, not as its 10k-token cut.
    entry = conv.library.get("note:transcript.md")
    assert entry is not None and entry.tokens < 3_000
    cut_before = sum(1 for e in conv.library if e.cut)
    after = conv.turn("What did we decide?")
    check_envelope(after, big)
    restored = [d for d in after.report.decisions if d.action is DecisionAction.RESTORED]
    assert restored
    assert sum(1 for e in conv.library if e.cut) < cut_before
    assert exact_request_tokens(after) == after.report.budget.used <= budget.limit  # type: ignore[union-attr]


def test_the_plan_is_validated_and_reported() -> None:
    """One policy object on the Budget: validated fields, reported in the JSON trace."""
    with pytest.raises(ConfigError, match=r"budget\.plan\.library_floor"):
        BudgetPlan(library_floor=1.5)
    with pytest.raises(ConfigError, match=r"budget\.plan\.restore"):
        BudgetPlan(restore=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"budget\.plan"):
        Budget(3000, plan={"slack": 0.1})  # type: ignore[arg-type]
    conv = Conversation("You answer.", vault=EXAMPLE, budget=CASCADE)
    env = conv.turn("The spec.", [note("project-spec.md")])
    plan = trace_document([env], conv.counter)["turns"][0]["budget"]["plan"]
    assert plan == {
        "library_floor": "0.25",
        "history_turns": "2",
        "slack": "0.2",
        "slack_turns": "4",
        "restore_min": "0.4",
        "restore": "True",
        "restore_append": "True",
        "library_floor_tokens": "650",
        "slack_tokens": "520",
    }


def test_the_slack_follows_the_conversations_growth() -> None:
    """The room a cut leaves beyond the excess is what the last ``slack_turns`` turns added
    to history (framed queries and replies; their mean stands for the turns a younger
    conversation lacks), at most ``slack`` of the limit; before the first reply, or with
    ``slack_turns=0``, the flat share."""

    def slack(plan: BudgetPlan, turns: int) -> list[int]:
        budget = Budget(3000, reserve_output=400, plan=plan, policy="current-first")
        conv = Conversation("You answer.", vault=EXAMPLE, budget=budget)
        out = []
        for i in range(turns):
            env = conv.turn(f"Question {i}?")
            out.append(int(dict(env.report.budget.plan)["slack_tokens"]))  # type: ignore[union-attr]
            conv.reply("A reply of a few words.")
        return out

    framed = Budget(3000, reserve_output=400).per_message_tokens
    one = (
        Conversation("x").counter.count("Question 0?")
        + Conversation("x").counter.count("A reply of a few words.")
        + 2 * framed
    )
    grown = slack(BudgetPlan(), 6)
    assert grown == [520] + [4 * one] * 5 and 4 * one < 520
    assert slack(BudgetPlan(slack_turns=0), 6) == [520] * 6
    assert slack(BudgetPlan(slack=0.01), 6)[5] == 26  # the share caps it


def test_restore_off_keeps_every_cut() -> None:
    """``BudgetPlan(restore=False)``: a cut entry stays cut (the old behaviour)."""
    budget = Budget(3000, reserve_output=400, plan=BudgetPlan(restore=False))
    conv = Conversation("You answer.", vault=EXAMPLE, budget=budget)
    for text, keys in (("Spec.", ["project-spec.md"]), ("API.", ["docs/api-docs.md"])):
        conv.turn(text, [note(k) for k in keys])
        conv.reply("Noted.")
    env = conv.turn("Which milestone is next?")
    assert _l2(env)["note:project-spec.md"] is Form.PREVIEW


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
    them), counts are exact, and a turn that cuts nothing leaves no entry cut whose whole
    form would fit its headroom less the slack and is worth a restore (restore_min)."""
    budget = Budget(window, reserve_output=window // 6)
    plan = budget.plan
    conv = Conversation("You answer.", vault=EXAMPLE, budget=budget)
    previous: Envelope | None = None
    for i, keys in enumerate(turns):
        env = conv.turn(f"Question {i}.", [note(k) for k in keys])
        report = env.report.budget
        assert report is not None
        check_envelope(env, previous)
        assert exact_request_tokens(env) == report.used <= budget.limit
        sent = {s.key for s in env.l3.segments if s.form is not Form.REFERENCE}
        if not any(d.action in CUTS for d in report.decisions):
            room = report.headroom - int(dict(report.plan)["slack_tokens"])
            for entry in conv.library:
                if not entry.cut or entry.key in sent or entry.whole is None:
                    continue
                whole = conv.counter.count(conv.renderer.render(entry.whole))
                grow = whole - entry.tokens
                # 2 tokens: a block's join with its neighbours may move by a piece.
                assert not (budget.limit * plan.restore_min <= grow <= room - 2), (
                    entry.key,
                    window,
                    turns,
                    [(d.action.value, d.target) for d in report.decisions],
                )
        conv.reply("Noted.")
        previous = env


def test_the_plan_and_cut_entries_survive_a_store(tmp_path: Path) -> None:
    """A stored conversation keeps its plan and its cut entries' whole forms: restored,
    its next turn is the live one's, restores and all."""
    budget = Budget(3000, reserve_output=400, plan=BudgetPlan(library_floor=0.1))
    live = Conversation("You answer.", vault=EXAMPLE, budget=budget)
    with SqliteStore(tmp_path / "chat.db") as store:
        store.create(ConversationInfo("c"))
        for text, keys in (("Spec.", ["project-spec.md"]), ("API.", ["docs/api-docs.md"])):
            env = live.turn(text, [note(k) for k in keys])
            live.reply("Noted.")
            save_turn(store, "c", live, env)
        again = load_conversation(store, "c", vault=EXAMPLE)
    assert again.budget is not None and again.budget.plan == budget.plan
    assert again.library == live.library
    assert any(e.cut for e in again.library)
    want, got = live.turn("Which milestone?"), again.turn("Which milestone?")
    assert got.system_text == want.system_text and got.report == want.report


def test_prefix_first_never_refers_to_a_stub() -> None:
    """The one-cut-at-a-time orders too: a re-attached entry evicted in its own turn is
    listed as not sent, never a reference to the stub."""
    budget = Budget(600, reserve_output=50, policy="prefix-first")
    conv = Conversation("You answer.", vault=EXAMPLE, budget=budget)
    conv.turn("The spec.", [note("project-spec.md")])
    conv.reply("Noted.")
    env = conv.turn("Spec, API and auth.", [note(k) for k in NOTES[:3]])
    check_envelope(env)
    assert _l2(env)["note:project-spec.md"] is Form.REFERENCE  # evicted to a stub
    spec = next(s for s in env.l3.segments if s.key == "note:project-spec.md")
    assert spec.form is Form.REFERENCE and spec.unsent


def test_stubs_folded_into_a_library_index_come_back_when_room_frees_up(
    tmp_path: Path,
) -> None:
    """A documentation vault at 8k: re-attaching a long note folds small library entries
    into their folders' indexes; the next turn, with room (restores from 15% of the
    limit), unfolds the indexes into the entries they list, whole, and a conversation
    restored from SQLite does the same."""
    from tests.test_real_material import KEPANO, KEPANO_CHAT

    budget = Budget(
        8000, reserve_output=1000, plan=BudgetPlan(restore_min=0.15), policy="current-first"
    )
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
    restored = {d.target for d in want.report.decisions if d.action is DecisionAction.RESTORED}
    back = listed & set(want.l2.keys())
    assert back and back <= restored
    assert want.l2.tokens > previous.l2.tokens + 1_000
    assert all(want.l2.get(k).form is not Form.REFERENCE for k in back)  # type: ignore[union-attr]


def test_a_reattached_long_note_cuts_the_library_no_deeper_than_it_needs() -> None:
    """The documentation vault at 8k: turn 9 re-attaches a 2,281-token note the library
    holds as its preview. The library of ~100 small notes is cut by what the excess needs
    (small entries folded into their folder's index, newest first, no slack kept since the
    next turn has the note's room back), not to its stubs' index (5,439 -> 427 tokens);
    each entry folded is a decision, and the turn uses most of its limit."""
    from tests.test_real_material import KEPANO, KEPANO_CHAT

    budget = Budget(8000, reserve_output=1000)
    conv = Conversation("You answer from the attached notes.", vault=KEPANO, budget=budget)
    previous: Envelope | None = None
    for i, (query, attach) in enumerate(KEPANO_CHAT[:9]):
        env = conv.turn(query, attach)
        check_envelope(env, previous)
        conv.reply(f"Answer {i + 1}.")
        previous = env
    assert previous is not None and previous.report.budget is not None
    report = previous.report.budget
    assert report.used >= 0.9 * report.limit
    assert previous.l2.tokens > 3_000
    folded = [d for d in report.decisions if d.action is DecisionAction.INDEXED]
    assert folded and {d.target for d in folded}.isdisjoint(previous.l2.keys())


def _partly(env: Envelope) -> list[Decision]:
    """The decisions of ``env``'s partial unfolds."""
    return [d for d in env.report.decisions if d.reason.startswith("library index partly")]


def test_an_index_unfolds_as_far_as_room_allows() -> None:
    """The documentation vault at 4k: after the re-attached long note leaves, a turn has
    room for some of the entries a folder's index folds, not all: those come back whole
    in the index's place and a smaller index lists the rest (nothing listed twice or
    lost), and a conversation built again decides the same."""
    from tests.test_real_material import KEPANO, KEPANO_CHAT

    def chat() -> tuple[list[Envelope], Conversation]:
        # Recall off: recalled passages change which later turn finds room to unfold.
        budget = Budget(4000, 600, recall_share=0.0)
        conv = Conversation("You answer from the attached notes.", vault=KEPANO, budget=budget)
        envs: list[Envelope] = []
        for i, (query, attach) in enumerate(KEPANO_CHAT):
            envs.append(conv.turn(query, attach))
            check_envelope(envs[-1], envs[-2] if len(envs) > 1 else None)
            conv.reply(f"Answer {i + 1}: " + "the notes say several things about this. " * 8)
            if _partly(envs[-1]):
                break
        return envs, conv

    envs, conv = chat()
    before, after = envs[-2], envs[-1]
    part = _partly(after)
    index = next(d.target for d in part if d.target.startswith("index:"))
    back = {d.target for d in part} - {index}
    keys = set(after.l2.keys())
    assert back and back <= keys and index in keys
    entry = conv.library.get(index)
    assert entry is not None and entry.folded
    left = {e.key for e in entry.folded}
    assert left.isdisjoint(back)
    was, now = before.l2.get(index), after.l2.get(index)
    assert was is not None and now is not None
    items = int(dict(was.attributes)["items"])
    assert int(dict(now.attributes)["items"]) == len(left) == items - len(back)
    assert all(after.l2.get(k).form is Form.FULL for k in back)  # type: ignore[union-attr]
    listed = "\n- " in now.text  # an index past the stubs' share keeps only its count
    assert all(f"- {k}" in now.text for k in left) or not listed
    again, _ = chat()
    assert [e.system_text for e in again] == [e.system_text for e in envs]


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


def test_stubs_join_their_folders_index_where_it_stands() -> None:
    """A folder's stub older than the folder's library index joins the index in the
    index's place: moving the index up to the stub's place would reorder the library
    (invariant 5; found over random chats once small entries were folded into indexes)."""
    from lamina.pipeline._budget.fit import _stub
    from lamina.pipeline._budget.stubs import bound_stubs, fold

    conv = Conversation("You answer.", vault=EXAMPLE)
    keys = ("meetings/2026-10-19.md", "docs/api-docs.md", "docs/auth.md", "meetings/2026-11-02.md")
    conv.turn("Notes.", [note(k) for k in keys])
    conv.reply("Noted.")
    _, graph = conv._build("And?")
    library = conv.library
    first, last = (library.get(f"note:{k}") for k in (keys[0], keys[3]))
    assert first is not None and last is not None
    library = library.replace(_stub(graph, first))
    library, _, _ = fold(graph, library, "folder:meetings", [_stub(graph, last)])
    assert library.keys() == (
        "note:meetings/2026-10-19.md", "note:docs/api-docs.md", "note:docs/auth.md",
        "index:folder:meetings",
    )  # fmt: skip
    bounded = bound_stubs(graph, library, cap=1)
    assert bounded is not None
    collapsed, decisions = bounded
    assert collapsed.keys() == (
        "note:docs/api-docs.md",
        "note:docs/auth.md",
        "index:folder:meetings",
    )
    index = collapsed.get("index:folder:meetings")
    assert index is not None
    assert [e.key for e in index.folded] == [f"note:{keys[3]}", f"note:{keys[0]}"]
    assert decisions[0].target == f"note:{keys[0]}"


def _tiny_vault(root: Path) -> Path:
    """Three notes of a few words (blocks of 35-54 tokens, stubs of 34-46) and one large
    note of twelve sections."""
    (root / "Daily").mkdir()
    (root / "Categories").mkdir()
    (root / "Daily" / "2023-09-12.md").write_text("# 2023-09-12\n\nRained all day.\n")
    (root / "Daily" / "2023-09-30.md").write_text("# 2023-09-30\n\nA long walk.\n")
    (root / "Categories" / "Clippings.md").write_text("# Clippings\n\nSaved articles.\n")
    words = ["alpha", "beta", "gamma", "delta", "river", "stone"]
    words += ["cloud", "paper", "lamp", "garden", "window", "table"]
    body = "\n".join(
        f"\n## Section {s}\n\n" + " ".join(words[(s * 7 + i) % 12] for i in range(120))
        for s in range(12)
    )
    (root / "big.md").write_text(f"# Big\n{body}\n")
    return root


def test_a_cut_that_saves_a_few_tokens_is_not_made(tmp_path: Path) -> None:
    """Three small notes in the library at their floor, then a large note that must be
    cut: no note becomes a stub that saves a token or two (the 35-token note's stub is 34,
    a daily note's 46 of 53); the large note's preview takes the cut instead."""
    conv = Conversation(
        "You answer.", vault=_tiny_vault(tmp_path), budget=Budget(560, 0, policy="current-first")
    )
    small = ("Daily/2023-09-12.md", "Daily/2023-09-30.md", "Categories/Clippings.md")
    conv.turn("Days.", [note(k) for k in small])
    conv.reply("Noted.")
    env = conv.turn("The big one.", [note("big.md")])
    report = env.report.budget
    assert report is not None and exact_request_tokens(env) == report.used <= 560
    assert [(s.key, s.form, s.tokens) for s in env.l2.segments] == [
        ("note:Daily/2023-09-12.md", Form.FULL, 54),
        ("note:Daily/2023-09-30.md", Form.FULL, 53),
        ("note:Categories/Clippings.md", Form.FULL, 35),
    ]
    assert [(d.target, str(d.to_form)) for d in report.decisions] == [("note:big.md", "preview")]


def test_tiny_cuts_are_made_only_when_nothing_else_is_left(tmp_path: Path) -> None:
    """Where only the small notes are left to cut (no attachment, history at its last
    turn, the window tight), they still give way rather than the turn failing: the daily
    notes go into their folder's index (which keeps only its count, stubs being over their
    share) and the category note to a stub."""
    conv = Conversation(
        "You answer.", vault=_tiny_vault(tmp_path), budget=Budget(250, 0, policy="current-first")
    )
    small = ("Daily/2023-09-12.md", "Daily/2023-09-30.md", "Categories/Clippings.md")
    conv.turn("Days.", [note(k) for k in small])
    conv.reply("Noted.")
    env = conv.turn("And?", [])
    report = env.report.budget
    assert report is not None and exact_request_tokens(env) == report.used <= 250
    assert [(s.key, s.form, s.tokens) for s in env.l2.segments] == [
        ("index:folder:Daily", Form.FULL, 66),
        ("note:Categories/Clippings.md", Form.REFERENCE, 34),
    ]


def test_a_fold_that_saves_a_few_tokens_an_entry_is_not_made(tmp_path: Path) -> None:
    """Two daily notes (107 tokens) folded into a new index of two lines (98) save 9: the
    fold pass passes them over, and folds them only as a last resort."""
    from lamina.pipeline._budget.fit import _fold_count, _stub

    conv = Conversation("You answer.", vault=_tiny_vault(tmp_path))
    conv.turn("Days.", [note("Daily/2023-09-12.md"), note("Daily/2023-09-30.md")])
    conv.reply("Noted.")
    _, graph = conv._build("And?")
    stubs = [_stub(graph, e) for e in conv.library.entries]
    args = (graph, conv.library, "folder:Daily", stubs, 5, 500)
    assert _fold_count(*args) == 0
    assert _fold_count(*args, worth_it=False) == 2


def test_a_partial_unfold_brings_back_the_most_that_fit(tmp_path: Path) -> None:
    """``fit._part_unfolded`` over an index of six daily notes, for every room: the most
    of the first entries whose growth (they whole, a smaller index of the rest) is within
    it, as a scan of every count finds them; none when not even one fits."""
    from lamina.pipeline._budget.fit import _part_unfolded, _stub
    from lamina.pipeline._budget.stubs import fold, refold

    daily = tmp_path / "Daily"
    daily.mkdir()
    keys = []
    for day in range(1, 7):
        (daily / f"2023-09-0{day}.md").write_text(f"# Day {day}\n\n" + "Walked. " * day * 3)
        keys.append(f"Daily/2023-09-0{day}.md")
    conv = Conversation("You answer.", vault=tmp_path)
    conv.turn("Days.", [note(k) for k in keys])
    conv.reply("Noted.")
    _, graph = conv._build("And?")
    wholes = list(conv.library.entries)
    library, index, _ = fold(graph, conv.library, "folder:Daily", [_stub(graph, e) for e in wholes])
    assert library.keys() == ("index:folder:Daily",)
    stays = list(index.folded)
    growth = [
        sum(e.tokens for e in wholes[:k]) + refold(graph, index, stays[k:]).tokens - index.tokens
        for k in range(1, len(stays))
    ]
    assert growth == sorted(growth) and growth[0] > 0
    for room in range(0, growth[-1] + 40, 7):
        part = _part_unfolded(graph, index, stays, list(wholes), room)
        most = sum(1 for g in growth if g <= room)
        if most == 0:
            assert part is None
            continue
        assert part is not None
        back, rest, grew = part
        assert [e.key for e in back] == [e.key for e in wholes[:most]]
        assert [e.key for e in rest.folded] == [e.key for e in stays[most:]]
        assert grew == growth[most - 1]


@given(n=st.integers(0, 40), at=st.integers(1, 42), lo=st.integers(1, 5))
def test_the_budgets_bisection_finds_the_boundary(n: int, at: int, lo: int) -> None:
    """``fit._first``: the least k in lo..n where a monotone condition holds, n + 1 if none,
    as a scan finds it."""
    from lamina.pipeline._budget.fit import _first

    seen: list[int] = []

    def holds(k: int) -> bool:
        seen.append(k)
        return k >= at

    want = next((k for k in range(lo, n + 1) if k >= at), max(lo, n + 1))
    assert _first(lo, n, holds) == want
    assert all(lo <= k <= n for k in seen) and len(seen) <= max(n - lo + 1, 0).bit_length()


def _unguarded_restore(
    turn: object, used: int, budget: Budget, measured: object
) -> tuple[object, list[Decision]] | None:
    """``restore`` as it was before it skipped the batch with less room than it needs."""
    import math

    from lamina.pipeline._budget import fit

    room = budget.limit - budget.effective(used) - fit.slack_of(turn, budget, measured)  # type: ignore[arg-type]
    if room <= 0 or not any(e.cut or e.folded for e in turn.library.entries):  # type: ignore[attr-defined]
        return None
    out, decisions, gained, _ = fit._restored(turn, room, 0)  # type: ignore[arg-type]
    out, unfolded, more = fit._unfolded(out, room - gained, 0)
    decisions, gained = decisions + unfolded, gained + more
    if decisions and gained >= math.ceil(budget.limit * budget.plan.restore_min):
        return out, decisions
    breaks = fit._breaks_at(turn)  # type: ignore[arg-type]
    if breaks is None:
        return None
    out, decisions, gained, _ = fit._restored(turn, room, breaks)  # type: ignore[arg-type]
    out, unfolded, more = fit._unfolded(out, room - gained, breaks)
    decisions += unfolded
    return (out, decisions) if decisions else None


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(st.lists(st.sampled_from(NOTES), max_size=3), min_size=4, max_size=10),
    window=st.integers(min_value=1800, max_value=6000),
    restore_min=st.sampled_from([0.0, 0.15, 0.4]),
)
def test_a_restore_with_less_room_than_a_batch_needs_is_not_tried(
    monkeypatch: pytest.MonkeyPatch, turns: list[list[str]], window: int, restore_min: float
) -> None:
    """Every restore decides what computing the batch first (and dropping it) decided:
    a restore gives back at most its room, so with less room than ``restore_min`` of the
    limit the batch is not computed."""
    from lamina.pipeline._budget import fit

    real = fit.restore
    calls: list[bool] = []

    def both(turn: object, used: int, budget: Budget, measured: object) -> object:
        got = real(turn, used, budget, measured)  # type: ignore[arg-type]
        want = _unguarded_restore(turn, used, budget, measured)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got[1] == want[1]
            assert got[0].library == want[0].library  # type: ignore[attr-defined]
        calls.append(got is None)
        return got

    with monkeypatch.context() as patch:
        patch.setattr(fit, "restore", both)
        budget = Budget(
            window, window // 6, plan=BudgetPlan(restore_min=restore_min), policy="current-first"
        )
        conv = Conversation("You answer.", vault=EXAMPLE, budget=budget)
        for i, keys in enumerate(turns):
            conv.turn(f"Question {i}.", [note(k) for k in keys])
            conv.reply("Noted.")
    assert len(calls) == len(turns)  # each turn's fit asked once
