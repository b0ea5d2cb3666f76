"""The library's growth deferred to the next prefix break (``Conversation(defer_library=
True)``): each request extends the one before it byte for byte or settles with a reason,
never over the budget, and a restored conversation sends the same bytes."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lamina import Conversation, load_conversation, rebuild_envelope
from lamina.pipeline import (
    Budget,
    ConversationState,
    DecisionAction,
    Envelope,
    Form,
    check_envelope,
)
from lamina.pipeline.store import ConversationInfo, save_turn
from lamina.pipeline.tools import tool
from lamina.renderers import openai_messages, prefix_reports
from tests.stores import Backend

_NOTES = {
    "alpha.md": "# Alpha\n\nThe alpha service syncs field notes nightly.\n",
    "beta.md": "# Beta\n\nBeta holds the retry policy: three tries, then a report.\n",
    "gamma.md": "# Gamma\n\n" + "Gamma logs every sync in a ledger. " * 30 + "\n",
    "delta.md": "# Delta\n\n" + "## Part\n\nDelta keeps the schema versions. " * 12,
    "eps.md": "# Epsilon\n\nEpsilon is the offline cache.\n",
}


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch-vault")
    for name, text in _NOTES.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def _messages(env: Envelope) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in openai_messages(env)]


def test_a_three_turn_batched_request_renders_as_expected(vault: Path) -> None:
    """Turn 1 settles; turns 2 and 3 keep the system message and carry each turn's
    context in the user message that sent it, referring back to what was sent."""
    conv = Conversation("Be terse.", vault=vault, defer_library=True)
    conv.turn("What is alpha?", [{"note": "alpha.md"}])
    conv.reply("A sync service.")
    conv.turn("And beta?", [{"note": "beta.md"}])
    conv.reply("Retries.")
    env = conv.turn("Compare them.", [{"note": "alpha.md"}, {"note": "eps.md"}])
    alpha = (
        '<note key="note:alpha.md" title="alpha" path="alpha.md">\n'
        "# Alpha\n\nThe alpha service syncs field notes nightly.\n\n</note>"
    )
    beta = (
        '<note key="note:beta.md" title="beta" path="beta.md">\n'
        "# Beta\n\nBeta holds the retry policy: three tries, then a report.\n\n</note>"
    )
    eps = (
        '<note key="note:eps.md" title="eps" path="eps.md">\n'
        "# Epsilon\n\nEpsilon is the offline cache.\n\n</note>"
    )
    label = "---\n[User query]:\n"
    assert _messages(env) == [
        ("system", "Be terse."),
        ("user", f"{alpha}\n\n{label}What is alpha?"),
        ("assistant", "A sync service."),
        ("user", f"{beta}\n\n{label}And beta?"),
        ("assistant", "Retries."),
        (
            "user",
            "Context attached to this message (sent in full earlier in this conversation):\n"
            '<reference key="note:alpha.md" source="note" title="alpha" path="alpha.md"/>'
            f"\n\n{eps}\n\n{label}Compare them.",
        ),
    ]
    assert env.batch is not None and env.batch.reason == "" and env.batch.settled == 0
    assert conv.count_request(env) == env.batch.tokens
    check_envelope(env)


def test_the_envelope_as_built_is_unchanged_by_the_batch(vault: Path) -> None:
    """The layers (and so their hashes and the stored manifest) are the same either way."""
    envs = []
    for defer in (False, True):
        conv = Conversation("Be terse.", vault=vault, defer_library=defer)
        conv.turn("a", [{"note": "alpha.md"}])
        conv.reply("ok")
        envs.append(conv.turn("b", [{"note": "beta.md"}]))
    plain, batched = envs
    assert batched.layers == plain.layers and batched.prefix_hash == plain.prefix_hash
    assert plain.batch is None and batched.batch is not None
    assert _messages(plain) != _messages(batched)


def test_a_batched_request_sends_l1_as_the_envelope_holds_it(vault: Path) -> None:
    """An agent loop's handoff swaps L1 in the envelope it sends: the batched request's
    system message is that L1 and the settled library, not the settled message."""
    from lamina.pipeline import Form as F
    from lamina.pipeline import Layer, LayerName, Segment

    conv = Conversation("Be terse.", vault=vault)
    conv.turn("a", [{"note": "alpha.md"}])
    conv.reply("ok")
    env = conv.turn("b", [{"note": "beta.md"}])
    l1 = Segment("system:stable", F.TEXT, "system", "h", "Be verbose.", 3)
    handed = attrs.evolve(env, layers=(Layer(LayerName.L1, (l1,), 3), *env.layers[1:]))
    assert _messages(handed)[0] == ("system", "Be verbose.")
    assert _messages(handed)[1:] == _messages(env)[1:]


def test_a_changed_system_prompt_settles(vault: Path) -> None:
    conv = Conversation("Be terse.", vault=vault, defer_library=True)
    conv.turn("a", [{"note": "alpha.md"}])
    conv.reply("ok")
    conv.set_system(mutable="Today is Monday.")
    env = conv.turn("b", [{"note": "beta.md"}])
    assert env.batch is not None and env.batch.reason == "system-changed"
    assert _messages(env)[0] == ("system", env.system_text)


def test_a_batch_that_would_not_fit_settles_and_fits(vault: Path) -> None:
    # Recall off: recalled passages fill the room whose lack makes this batch settle. At
    # 600 the budget leaves the next turn's growth free, and turn 4's note still does not
    # fit beside the batch.
    budget = Budget(context_window=600, reserve_output=200, recall=False)
    conv = Conversation("Be terse.", vault=vault, budget=budget, defer_library=True)
    reasons = []
    notes = ["gamma.md", "delta.md", "gamma.md", "alpha.md", "beta.md", "eps.md", "delta.md"]
    for i, note in enumerate(notes):
        env = conv.turn(f"q{i}", [{"note": note}])
        conv.reply(f"a{i}")
        assert env.batch is not None
        assert conv.count_request(env) == env.batch.tokens <= budget.limit
        reasons.append(env.batch.reason)
        check_envelope(env)
    assert "over-budget" in reasons


def test_states_saved_without_the_switch_keep_the_library_layout(vault: Path) -> None:
    """A state without ``defer_library`` (saved before it) restores with it off."""
    conv = Conversation("Be terse.", vault=vault, defer_library=True)
    conv.turn("a", [{"note": "alpha.md"}])
    conv.reply("ok")
    old = ConversationState(conv.state.system, conv.state.library, conv.state.history)
    again = Conversation.restore(old, vault=vault)
    assert not again.defer_library
    assert again.turn("b", [{"note": "beta.md"}]).batch is None


def test_restore_from_a_store_sends_the_same_bytes(backend: Backend, vault: Path) -> None:
    live = Conversation("Be terse.", vault=vault, defer_library=True)
    turns = [("a", "alpha.md"), ("b", "beta.md"), ("c", "gamma.md"), ("d", "alpha.md")]
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        for i, (text, note) in enumerate(turns):
            env = live.turn(text, [{"note": note}])
            save_turn(store, "c", live, env)
            live.reply(f"answer {i}")
            save_turn(store, "c", live, env)
            if i == 1:
                restored = load_conversation(store, "c", vault=vault)
                assert restored.defer_library
            elif i > 1:
                again = restored.turn(text, [{"note": note}])
                restored.reply(f"answer {i}")
                assert _messages(again) == _messages(env) and again.batch == env.batch


def test_a_stored_turn_is_rebuilt_with_the_request_it_sent(tmp_path: Path, vault: Path) -> None:
    """``rebuild_envelope`` replays a turn from the state before it: the same batch, so the
    same request (its hash is in the stored manifest)."""
    from lamina.pipeline.store import Manifest, open_store

    conv = Conversation("Be terse.", vault=vault)
    assert conv.defer_library  # the default
    envs = []
    with open_store(str(tmp_path / "s.db")) as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        for i, note in enumerate(["alpha.md", "beta.md", "gamma.md"]):
            envs.append(conv.turn(f"q{i}", [{"note": note}]))
            conv.reply(f"a{i}")
            save_turn(store, "c", conv, envs[-1], [{"note": note}])
        for k, env in enumerate(envs, start=1):
            again = rebuild_envelope(store, "c", k, vault=vault)
            assert again is not None and again.batch == env.batch and again == env
            assert _messages(again) == _messages(env)
            assert Manifest.of(env).batch_hash != ""


_choices = st.lists(
    st.tuples(
        st.lists(st.sampled_from(sorted(_NOTES)), max_size=3, unique=True),
        st.booleans(),
    ),
    min_size=2,
    max_size=7,
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(turns=_choices, window=st.sampled_from([None, 1500, 2500]), data=st.data())
def test_each_request_extends_the_last_or_settles_with_a_reason(
    turns: list[tuple[list[str], bool]],
    window: int | None,
    data: st.DataObject,
    vault: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Over random attachments, with and without a budget: each request is a byte
    extension of the one before or a settle with its reason, never over the budget, and
    a conversation restored from SQLite builds the same bytes."""
    budget = None if window is None else Budget(context_window=window, reserve_output=300)
    conv = Conversation("Be terse.", vault=vault, budget=budget, defer_library=True)
    k = data.draw(st.integers(0, len(turns) - 1), label="restore after turn")
    path = tmp_path_factory.mktemp("batch-db") / "s.db"
    from lamina.pipeline.store import open_store

    previous: list[tuple[str, str]] | None = None
    prev_env: Envelope | None = None
    restored: Conversation | None = None
    with open_store(str(path)) as store:
        store.create(ConversationInfo("c", vault=str(vault)))
        for i, (notes, replied) in enumerate(turns):
            attach = [{"note": n} for n in notes]
            env = conv.turn(f"question {i}", attach)
            messages = _messages(env)
            assert env.batch is not None
            if previous is not None and env.batch.reason == "":
                assert messages[: len(previous)] == previous
                assert len(messages) > len(previous)
            elif previous is not None:
                assert env.batch.reason in {
                    "system-changed", "history-changed", "over-budget", "given-back"
                }
            if budget is not None:
                assert conv.count_request(env) == env.batch.tokens <= budget.limit
                # The report's second figure is the request as sent, beside ``used``.
                assert env.report.budget is not None
                assert env.report.budget.sent == env.batch.tokens
            check_envelope(env, prev_env)
            if restored is not None:
                again = restored.turn(f"question {i}", attach)
                assert _messages(again) == messages
            if replied:
                conv.reply(f"answer {i}")
                if restored is not None:
                    restored.reply(f"answer {i}")
            save_turn(store, "c", conv, env)
            if i == k:
                restored = load_conversation(store, "c", vault=vault)
            previous, prev_env = messages, env


_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# chat30's window for the restores by appending pinned below. At 4,500 (limit 3,000) the
# meeting note of 19 October, set aside, is sent whole again in the settle of turn 16;
# turn 17 settles again (its attachment does not fit beside it) and sets it aside again.
# (At 4,250 before a library entry held as the preview first sent had previews of that
# preview: the note was sent whole again in turns 16, with the design-review PDF, and 17;
# at 6,000 before a restore cost the cache only what the last request sent of the
# entries after it; at 4,750 before an item attached now was worth the top of its
# recency instead of x1.5; turns 16 and 25 there before the cache price became the
# provider's discount, 0.9 from 0.7; at 4,500 before the entries set aside were kept
# unsent and a shed that keeps less of the growth than it re-sends settled.)
_WINDOW = 4500


def _budget(window: int = _WINDOW) -> Budget:
    # Recall off: recalled passages take the free room a restore by appending would use.
    return Budget(context_window=window, reserve_output=1500, recall=False)


def _chat30(turns: int, first: int = 0, window: int = _WINDOW) -> list[Envelope]:
    """chat30 at a 4,500-token window (``_WINDOW``) unless told: turns ``first`` to
    ``turns`` (numbered from 0) of one conversation, whose restores by appending these
    tests pin."""
    from lamina import load_script, run_script

    script = load_script(_EXAMPLES / "chat30.yaml")
    conv = Conversation(script.system, vault=script.vault, budget=_budget(window))
    return run_script(attrs.evolve(script, turns=script.turns[:turns]), conv)[first:]


def test_cut_entries_are_sent_whole_again_where_the_request_has_room() -> None:
    """chat30 at 4,500: turn 16 settles (its extension would not fit) with room beyond the
    headroom, and the meeting note of 19 October, which the budget set aside (kept in the
    library's index of entries set aside, not sent), goes whole in its user message,
    before the query, without the intro (the library shows no shorter block of it that
    it would stand for); the system message is left as it was (a restore by appending
    rewrites nothing). Turn 17 settles again and sends it not again. (See ``_WINDOW``.)"""
    from lamina.pipeline.layout import RESTORED_INTRO

    t16, t17 = _chat30(17, 15)
    assert t16.batch is not None and t17.batch is not None
    keys = ["note:meetings/2026-10-19.md"]
    assert [s.key for s in t16.batch.restored] == keys
    assert (t16.batch.reason, t17.batch.reason) == ("over-budget", "over-budget")
    assert [s.key for s in t17.batch.restored] == []
    messages = _messages(t16)
    (_, system), (role, user) = messages[0], messages[-1]
    assert role == "user"
    blocks = user.split("\n\n---\n[User query]:\n")[0]
    whole = "\n\n".join(s.text for s in t16.batch.restored)
    assert blocks.endswith(whole) and RESTORED_INTRO not in user
    for seg in t16.batch.restored:
        cut = t16.l2.get(seg.key)  # None: folded into an index (here set aside, unsent)
        assert cut is None or (str(cut.form) != "full" and cut.text in system)
        assert seg.text not in system
        assert not any(seg.text in text for _, text in _messages(t17))
    assert t16.batch.tokens <= _budget().limit


@pytest.mark.parametrize("window", [6500, 7000, 7750, 8000])
def test_recalled_passages_leave_free_what_the_batch_carries(window: int) -> None:
    """chat30 with recall (the default budget, reserve a quarter of the window): a request
    kept as it stood took recalled passages up to the limit as built, and its extension
    of the batch, whose earlier messages carry tokens the build does not hold, was then
    over the limit and settled, re-sending history from the batch's first message (on
    e230001, 43 turns of the windows 3,500-9,000 whose only change was a recall: turns 21
    and 24 at 6,500, 17 and 21 at 7,000). The passages now leave what the extension
    carries free, so such a turn extends the batch."""
    from lamina import load_script, run_script

    script = load_script(_EXAMPLES / "chat30.yaml")
    budget = Budget(context_window=window, reserve_output=window // 4)
    conv = Conversation(script.system, vault=script.vault, budget=budget)
    for env in run_script(script, conv):
        report = env.report.budget
        assert env.batch is not None and report is not None
        recall_only = {d.action for d in report.decisions} == {DecisionAction.RECALLED}
        assert not (recall_only and env.batch.reason == "over-budget"), env.turn
        assert env.batch.tokens <= report.limit


def test_a_shed_that_would_keep_less_of_the_growth_than_it_resends_settles() -> None:
    """chat30 at 6,000: turn 9's extension no longer fits with the library's growth of
    turns 1 to 8 deferred, and a shed would keep fewer of the growth's tokens cached than
    it sends again, so the batch settles instead: the five entries go into the system
    message. The next cut of history (turn 12) then re-sends only the growth deferred
    since (turns 10 and 11), not the library: its system message extends turn 11's. (A
    shed kept the growth deferred, and each later cut of history re-sent all of it: the
    whole library stayed in 16 deferred messages, cut entry by entry, until turn 17
    settled with 36 tokens cached.)"""
    envs = _chat30(12, 7, window=6000)  # turns 8 to 12
    t8, t9, t11, t12 = envs[0], envs[1], envs[3], envs[4]
    assert all(e.batch is not None for e in envs)
    assert t8.batch is not None and t9.batch is not None
    assert (t8.batch.reason, t8.batch.settled, len(t8.batch.turns)) == ("", 0, 7)
    assert (t9.batch.reason, t9.batch.settled, t9.batch.turns) == ("over-budget", 5, ())
    assert t9.batch.library_tokens > 0
    assert [e.batch.reason for e in envs[2:4] if e.batch] == ["", ""]
    assert t11.batch is not None and t12.batch is not None
    assert (t12.batch.reason, t12.batch.settled) == ("history-changed", 7)
    before, after = _messages(t11)[0], _messages(t12)[0]
    assert before[0] == after[0] == "system"
    assert after[1].startswith(before[1]) and len(after[1]) > len(before[1])
    assert t12.batch.library_tokens > t11.batch.library_tokens == t9.batch.library_tokens


def test_restores_by_appending_survive_a_store_round_trip(tmp_path: Path) -> None:
    """Restored from SQLite after turn 15, the conversation sends turns 16 and 17 (two
    turns that settle their batch, the first sending a cut entry whole again) byte for
    byte as the live one did: the budget's regret is part of the state saved. (chat30 at
    4,500, ``_WINDOW``; before a copy in L3 was valued by what it adds to the library's,
    turn 25 extended its batch with two restores instead.)"""
    from lamina import load_script, run_saved, run_script
    from lamina.pipeline.store import open_store

    script = load_script(_EXAMPLES / "chat30.yaml")
    live = Conversation(script.system, vault=script.vault, budget=_budget())
    want = _chat30(17, 15)
    assert [[s.key for s in e.batch.restored] for e in want if e.batch] == [
        ["note:meetings/2026-10-19.md"],
        [],
    ]
    assert [e.batch.reason for e in want if e.batch] == ["over-budget", "over-budget"]
    with open_store(str(tmp_path / "s.db")) as store:
        store.create(ConversationInfo("c", vault=str(script.vault)))
        run_saved(attrs.evolve(script, turns=script.turns[:15]), live, store, "c")
        again = load_conversation(store, "c", vault=script.vault)
    got = run_script(attrs.evolve(script, turns=script.turns[15:17]), again, check=False)
    assert [_messages(e) for e in got] == [_messages(e) for e in want]
    assert [e.batch for e in got] == [e.batch for e in want]


def test_a_batched_turn_that_restores_keeps_its_own_context_whole(vault: Path) -> None:
    """The extending path: a turn that attaches a new note and sends library entries whole
    again carries the note's full block, then the entry the library shows in no block of
    its own (folded into an index), then the intro and the entry it shows a block of,
    then the query, and records all as sent (the message is made once more with the
    restores, from what the batch sent before it, so the note is not taken for sent
    already)."""
    from lamina.pipeline import Form, Segment
    from lamina.pipeline._conversation.batch import batch_turn
    from lamina.pipeline.layout import RESTORED_INTRO

    live = Conversation("Be terse.", vault=vault, defer_library=True)
    live.turn("a", [{"note": "alpha.md"}])
    live.reply("ok")
    state = live.state.batch
    built = Conversation("Be terse.", vault=vault, defer_library=False)
    built.turn("a", [{"note": "alpha.md"}])
    built.reply("ok")
    env = built.turn("b", [{"note": "beta.md"}])
    block = '<note key="note:eps.md">E</note>'
    again = Segment("note:eps.md", Form.FULL, "note", "h-eps", block, 9)
    shown = '<note key="note:alpha.md">A</note>'
    alpha = Segment("note:alpha.md", Form.FULL, "note", "h-alpha", shown, 9)
    out, after = batch_turn(
        state,
        env,
        renderer=live.renderer,
        counter=live.counter,
        count=live.count_request,
        fits=lambda _used: True,
        room=lambda _used: 10_000,
        wholes=lambda _settled, _room, _sent: [(9, lambda: alpha), (9, lambda: again)],
    )
    assert out.batch is not None and out.batch.reason == ""
    assert out.batch.restored == (alpha, again)
    assert env.l2.get("note:alpha.md") is not None and env.l2.get("note:eps.md") is None
    beta = next(s for s in env.l3.segments if s.key == "note:beta.md")
    assert out.batch.user.text == "\n\n".join(
        [beta.text, again.text, RESTORED_INTRO, alpha.text, "---\n[User query]:\nb"]
    )
    assert dict(after.sent)["note:beta.md"] == beta.content_hash
    assert dict(after.sent)["note:eps.md"] == "h-eps"
    assert dict(after.sent)["note:alpha.md"] == "h-alpha"


_WORDS: tuple[str, ...] = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")
_WORDS += ("eta", "theta", "iota", "kappa", "lambda", "mu")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three folders of 40 short notes each: one fills a 3,000-token window."""
    root = tmp_path_factory.mktemp("folders")
    for folder in ("ships", "spells", "gear"):
        (root / folder).mkdir()
        for i in range(40):
            body = " ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(40))
            (root / folder / f"{folder}-{i:02d}.md").write_text(
                f"# {folder.title()} {i}\n\n{body}.\n\nMore: {body}.\n", encoding="utf-8"
            )
    return root


def test_a_question_after_a_folder_extends_the_request(folders: Path) -> None:
    """A folder a turn in a window it overflows, a question between them: the turn that
    cut leaves the headroom free and the question extends its request byte for byte (the
    folder stays in the message that sent it). Main before this: the cutting turn filled
    the limit, so the question cut history and settled (170 of 2,240 tokens cached)."""
    conv = Conversation(
        "You answer from the attached notes.",
        vault=folders,
        budget=Budget(context_window=3000, reserve_output=750),
    )
    turns = [
        ("What do the ships say?", [{"folder": "ships"}]),
        ("And the spells?", [{"folder": "spells"}]),
        ("Which is oldest?", []),
        ("And the gear?", [{"folder": "gear"}]),
        ("Which is newest?", []),
    ]
    sent: list[list[tuple[str, str]]] = []
    for i, (query, attach) in enumerate(turns):
        env = conv.turn(query, attach)
        sent.append(_messages(env))
        conv.reply(f"Answer {i + 1}: " + "the notes say several things about this. " * 8)
        assert env.batch is not None
        if not attach:
            assert env.batch.reason == ""
            assert sent[-1][: len(sent[-2])] == sent[-2]


def test_notes_after_a_folder_shed_the_tail_of_its_message(folders: Path) -> None:
    """A folder fills the window, then two notes need room: the budget cuts the folder's
    last notes, and the request sends the folder's message as it was up to the first block
    it cut, the rest as the library holds it now (the batch goes on; the cached prefix
    reaches into that message). Main before this: the batch settled, 6 of 2,120 tokens
    cached; now 1,485 of 2,025."""
    conv = Conversation(
        "You answer from the attached notes.",
        vault=folders,
        budget=Budget(context_window=3000, reserve_output=750),
    )
    first = conv.turn("What do the ships say?", [{"folder": "ships"}])
    conv.reply("Answer 1: " + "the notes say several things about this. " * 8)
    notes = [{"note": "gear/gear-00.md"}, {"note": "gear/gear-01.md"}]
    second = conv.turn("And this gear?", notes)
    assert second.batch is not None and second.batch.reason == ""
    cut = [d.target for d in second.report.decisions if d.layer == "L2"]
    assert cut and all(k.startswith("note:ships/") for k in cut)
    before, after = _messages(first), _messages(second)
    assert after[0] == before[0]  # the system message
    sent, now = before[1][1], after[1][1]
    kept = next(i for i, (a, b) in enumerate(zip(sent, now, strict=False)) if a != b)
    assert len(sent) // 2 < kept < len(sent)
    # From there on, the folder's notes as the library holds them now: no note cut to an
    # index line is sent in full.
    folded = [k for k in cut if second.l2.get(k) is None]
    assert folded and not any(f'<note key="{k}"' in now[kept:] for k in folded)
    assert second.batch.tokens <= conv.budget.limit
    assert prefix_reports([first, second], conv.counter)[1].common_prefix_tokens > 1_400


def test_shed_counts_count_the_growth_from_its_first_stale_block_at_its_library_forms() -> None:
    """The batch's messages as its shed would send them (what the budget weighs a request
    that fits as built against): the first message sent entries a and b, the second c.
    The library now holds b shortened, so from b's block on the growth counts at its
    library forms (b's new text; c as sent) and a stays as sent; b gone, its block counts
    nothing. With a shortened too, none of the growth would stay cached before the shed's
    start: the batch settles instead, ()."""
    from lamina.pipeline._conversation.batch import BatchState, DeferredTurn, shed_counts
    from lamina.pipeline.tokens import TokenCounter

    counter = TokenCounter()
    n = counter.count
    a, b, c, short = "alpha " * 100, "bravo " * 60, "charlie " * 20, "bravo " * 10
    first = DeferredTurn(1, "q1", (a, b, "q1"), 1000, keys=("note:a", "note:b", ""))
    second = DeferredTurn(2, "q2", (c, "q2"), 400, keys=("note:c", ""))
    state = BatchState(turns=(first, second))
    growth = {"note:a": (a, n(a)), "note:b": (short, n(short)), "note:c": (c, n(c))}
    assert shed_counts(state, growth, counter) == ((1, 1000 - n(b) + n(short)), (2, 400))
    assert shed_counts(state, {**growth, "note:b": (b, n(b))}, counter) == ((1, 1000), (2, 400))
    gone = {k: v for k, v in growth.items() if k != "note:b"}
    assert shed_counts(state, gone, counter) == ((1, 1000 - n(b)), (2, 400))
    assert shed_counts(state, {**growth, "note:a": ("alpha", n("alpha"))}, counter) == ()


def test_the_stale_key_is_the_first_block_the_library_holds_otherwise() -> None:
    """``stale_key``: the entry of the first block whose library form is not what the
    batch's message sent (b shortened as it entered the library: b; a too: a), "" when
    every block is as the library holds it or the state kept no keys."""
    from lamina.pipeline._conversation.batch import BatchState, DeferredTurn, stale_key

    a, b, c = "alpha " * 100, "bravo " * 60, "charlie " * 20
    first = DeferredTurn(1, "q1", (a, b, "q1"), 1000, keys=("note:a", "note:b", ""))
    second = DeferredTurn(2, "q2", (c, "q2"), 400, keys=("note:c", ""))
    state = BatchState(turns=(first, second))
    growth = {"note:a": (a, 101), "note:b": (b, 62), "note:c": (c, 41)}
    assert stale_key(state, growth) == ""
    assert stale_key(state, {**growth, "note:b": ("bravo", 1)}) == "note:b"
    assert stale_key(state, {**growth, "note:a": ("alpha", 1), "note:c": ("c", 1)}) == "note:a"
    assert stale_key(state, {**growth, "note:c": ("c", 1)}) == "note:c"
    unkeyed = DeferredTurn(1, "q1", (a, b, "q1"), 1000)
    assert stale_key(BatchState(turns=(unkeyed,)), {"note:a": ("alpha", 1)}) == ""


def test_shed_keys_are_the_growth_a_change_to_which_keeps_the_batch() -> None:
    """A change to an entry of the growth sheds from its block only where the blocks
    before it hold at least half the growth (101, 62 and 41 tokens: from c's block on,
    163 of 204); from an earlier one the batch settles. A block already stale sheds from
    there: after it, every key is one if that shed keeps the batch (b shortened: 101 of
    154 before it), none if not (a shortened: nothing before it)."""
    from lamina.pipeline._conversation.batch import BatchState, DeferredTurn, shed_keys
    from lamina.pipeline.tokens import TokenCounter

    counter = TokenCounter()
    n = counter.count
    a, b, c, short = "alpha " * 100, "bravo " * 60, "charlie " * 20, "bravo " * 10
    assert (n(a), n(b), n(c), n(short)) == (101, 62, 41, 12)
    first = DeferredTurn(1, "q1", (a, b, "q1"), 1000, keys=("note:a", "note:b", ""))
    second = DeferredTurn(2, "q2", (c, "q2"), 400, keys=("note:c", ""))
    state = BatchState(turns=(first, second))
    growth = {"note:a": (a, n(a)), "note:b": (b, n(b)), "note:c": (c, n(c))}
    assert shed_keys(state, growth, counter) == ("note:c",)
    assert shed_keys(state, {**growth, "note:b": (short, n(short))}, counter) == (
        "note:b",
        "note:c",
    )
    assert shed_keys(state, {**growth, "note:a": ("alpha", 1)}, counter) == ()
    unkeyed = DeferredTurn(1, "q1", (a, b, "q1"), 1000)
    assert shed_keys(BatchState(turns=(unkeyed, second)), growth, counter) == ()


@pytest.mark.parametrize("window", [4000, 6000, 16000])
def test_the_budget_counts_the_request_as_the_batch_sends_it(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the budget reads as the request sent (the build plus what the batch's earlier
    messages carry, ``objective._carried``) is the exact count of the request the batch
    sends, in every chat30 turn that extends its batch with the request kept as built
    (no cut, no restore: the request is then the build extended). Not checked: a turn
    whose context the batch's messages sent in full already (turn 26 at 4,000 attaches
    the design review turn 25 sent whole again): the batch sends a reference to it, the
    count reads the block (a known gap, on the safe side: the count reads more)."""
    import lamina.pipeline._budget.objective as objective
    from lamina.pipeline import Form
    from lamina.pipeline._turn.draft import Draft
    from lamina.pipeline._turn.graph import TurnGraph

    read: dict[int, int] = {}
    carried = objective._carried

    def counted(turn: TurnGraph, measured: Draft, used: int) -> int:
        more = carried(turn, measured, used)
        if turn.deferred:
            read[turn.ctx.turn] = used + more
        return more

    monkeypatch.setattr(objective, "_carried", counted)
    from lamina import load_script, run_script

    script = load_script(_EXAMPLES / "chat30.yaml")
    budget = Budget(context_window=window, reserve_output=window // 4, recall=False)
    conv = Conversation(script.system, vault=script.vault, budget=budget)
    checked = 0
    for env in run_script(script, conv):
        assert env.batch is not None
        extended = not (env.batch.reason or env.batch.restored or env.report.decisions)
        if env.turn not in read or not extended:
            continue
        user = env.batch.user.text
        if any(s.form is Form.FULL and s.text not in user for s in env.l3.segments):
            assert read[env.turn] > env.batch.tokens, env.turn
        else:
            checked += 1
            assert read[env.turn] == env.batch.tokens, env.turn
    assert checked >= 10


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four folders of 40 notes of 80-138 words each."""
    root = tmp_path_factory.mktemp("uneven")
    for folder in ("ships", "spells", "gear", "maps"):
        (root / folder).mkdir()
        for i in range(40):
            body = " ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(40 + (i * 7) % 30))
            (root / folder / f"{folder}-{i:02d}.md").write_text(
                f"# {folder.title()} {i}\n\n{body}.\n\nMore: {body}.\n", encoding="utf-8"
            )
    return root


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(window=5_500, attached=["ships", "ships", ""])
@example(window=3_500, attached=["", "ships", "", ""])
@given(
    window=st.integers(10, 23).map(lambda k: k * 250),
    attached=st.lists(
        st.sampled_from(("ships", "spells", "gear", "maps", "")), min_size=3, max_size=7
    ),
)
def test_a_question_after_a_turn_that_cut_extends_it(
    uneven: Path, window: int, attached: list[str]
) -> None:
    """Over random chats of folders and questions: a question that changes no form, right
    after a turn that changed forms, extends that turn's request byte for byte. The turn
    that cut left the headroom free as sent: where notes it cut are held by a deferred
    message, an extension that would send them as held and take the headroom is shed
    (sent as the budget cut them) instead of sent while the report names them cut. Before:
    5 of 60 such chats failed (a re-attached folder at 5,500 cut four notes its first
    message held, which the request sent anyway, 20 tokens under the limit; the next
    question shed)."""
    conv = Conversation(
        "You answer from the attached notes.",
        vault=uneven,
        budget=Budget(context_window=window, reserve_output=window // 4),
    )
    before: list[tuple[str, str]] | None = None
    changed = False
    for i, name in enumerate(attached):
        env = conv.turn(f"About {i}?", [{"folder": name}] if name else [])
        sent = _messages(env)
        cuts = bool(env.report.budget and env.report.budget.decisions)
        if not name and changed and not cuts and before is not None:
            assert env.batch is not None and env.batch.reason == ""
            assert sent[: len(before)] == before
        before, changed = sent, cuts
        conv.reply(f"Answer {i + 1}: " + "the notes say several things about this. " * 8)


def test_an_entry_the_budget_gives_back_reaches_the_model(tmp_path: Path) -> None:
    """A note attached beside a search result its host weighs 8x goes out as a preview,
    which enters the library's growth as sent; two turns later the budget gives the note
    back whole. While the batch extends, the model reads the deferred message (the
    preview), so the request settles (``given-back``) and sends the library as built: the
    note whole, the search result gone with its turn. (It extended, so the model never
    read the note whole while every report said it was given back.)"""

    def note_text(title: str, parts: int) -> str:
        sections = (
            f"## Part {i}\n\n"
            + " ".join(f"The {title} of part {i} lists item {j} at mark {i * j}." for j in range(8))
            for i in range(parts)
        )
        return f"# {title}\n\n" + "\n\n".join(sections) + "\n"

    (tmp_path / "atlas.md").write_text(note_text("atlas", 2), encoding="utf-8")
    (tmp_path / "survey.md").write_text(note_text("survey", 4), encoding="utf-8")
    rows = "\n".join(f"row {i}: sample {i} weighed {i * 7 % 13} grams" for i in range(500))
    budget = Budget(3_600, reserve_output=500, source_weights={"tool": 8.0})
    conv = Conversation("You answer.", vault=tmp_path, budget=budget)
    envs = [conv.turn("The atlas.", [{"note": "atlas.md"}])]
    conv.reply("Read.")
    envs.append(conv.turn("The survey beside the search.", [{"note": "survey.md"}],
                          tools=[tool("search", {"q": "samples"}, rows)]))  # fmt: skip
    conv.reply("Noted.")
    sent = envs[1].l3.get("note:survey.md")
    assert sent is not None and sent.form is Form.PREVIEW
    last = "The survey of part 3 lists item 7 at mark 21."
    for i in range(3):
        envs.append(conv.turn(f"Question {i}: what else?"))
        conv.reply("More.")
        check_envelope(envs[-1], envs[-2])
    given = next(e for e in envs if "note:survey.md" in _restored(e))
    assert given.batch is not None and given.batch.reason == "given-back"
    for env in envs[envs.index(given) :]:
        assert env.l2.get("note:survey.md").form is Form.FULL  # type: ignore[union-attr]
        assert any(last in str(content) for _, content in _messages(env))
        assert env.batch is not None and env.batch.tokens <= budget.limit
    before = envs[envs.index(given) - 1]
    assert not any(last in str(content) for _, content in _messages(before))


def _restored(env: Envelope) -> set[str]:
    """The entries the budget gave back in ``env``."""
    budget = env.report.budget
    actions = () if budget is None else budget.decisions
    return {d.target for d in actions if d.action is DecisionAction.RESTORED}
