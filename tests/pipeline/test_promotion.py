"""Promotion off the critical path: a turn returns before its new items are in L2, and the
library the next turn starts from is the same whether the background thread made it or not."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lamina import Conversation
from pipeline import Budget, Library, StageError
from pipeline._turn.promotion import Promotion

_PARTS = (f"## Part {i}\n\n" + "Sentence of the plan. " * 80 for i in range(12))
_NOTE = "# Plan\n\n" + "\n\n".join(_PARTS)


def _vault(tmp_path: Path) -> Path:
    root = tmp_path / "v"
    (root / "docs").mkdir(parents=True)
    for i in range(4):
        (root / "docs" / f"plan-{i}.md").write_text(_NOTE.replace("plan", f"plan {i}"), "utf-8")
    return root


def _turns(conv: Conversation, *, settle_now: bool) -> list[str]:
    texts = []
    for i in range(3):
        env = conv.turn(f"question {i}", attach=[{"note": f"docs/plan-{i}.md"}])
        if settle_now:
            _ = conv.library  # waits for the promotion
        conv.reply(f"answer {i}")
        texts.append(env.system_text + "\n" + env.user_text)
    return texts


def test_the_library_is_the_same_made_in_the_background_or_at_once(tmp_path: Path) -> None:
    vault = _vault(tmp_path)
    late = Conversation("s", vault=vault, budget=Budget(context_window=60_000))
    early = Conversation("s", vault=vault, budget=Budget(context_window=60_000))
    assert _turns(late, settle_now=False) == _turns(early, settle_now=True)
    assert late.state == early.state
    assert [e.view.form for e in late.library.entries] == [e.view.form for e in early.library]
    assert any(str(e.view.form) == "preview" for e in late.library.entries)


def test_a_turn_returns_before_its_promotion_is_made() -> None:
    release = threading.Event()
    made: list[int] = []

    def make() -> Library:
        release.wait(10)
        made.append(1)
        return Library()

    blocker = Promotion(make)
    blocker.start()  # occupies the one worker until released
    queued = Promotion(lambda: made.append(2) or Library())  # type: ignore[func-returns-value]
    queued.start()
    assert made == []
    # Not begun by the worker: made here, once, and the worker's turn does nothing.
    assert queued.result() == Library()
    assert made == [2]
    release.set()
    assert blocker.result() == Library()
    assert made == [2, 1]
    assert blocker.result() == Library() and made == [2, 1]


def test_a_failed_promotion_raises_where_the_library_is_asked_for(tmp_path: Path) -> None:
    vault = _vault(tmp_path)
    conv = Conversation("s", vault=vault)
    conv.turn("q", attach=[{"note": "docs/plan-0.md"}])

    def boom() -> Library:
        raise RuntimeError("disk on fire")

    before = conv._library
    conv._promotion = Promotion(boom)
    with pytest.raises(StageError, match="disk on fire") as info:
        _ = conv.library
    assert info.value.stage == "promote"
    # Once: the library stays as the turn found it and the conversation goes on.
    assert conv.library is before
    conv.reply("a")
    conv.turn("again", attach=[{"note": "docs/plan-0.md"}])
    assert "note:docs/plan-0.md" in conv.library


def test_the_graph_a_turn_began_with_is_freed_before_its_request_is_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pending promotion keeps of the graph only the new artifacts, not the graph
    promote copied to add view nodes, and edges are read without networkx's self-referring
    view: the first graph goes by reference counting alone, before assemble joins the
    request."""
    import gc
    import weakref

    import attrs

    import pipeline._conversation.conversation as conversation_module
    from pipeline import Pipeline, TurnGraph

    first: list[weakref.ref[object]] = []
    alive_at_join: list[bool] = []

    @attrs.frozen
    class Record:
        name: str = "record"
        after: tuple[str, ...] = ()
        before: tuple[str, ...] = ("expand",)

        def __call__(self, turn: TurnGraph) -> TurnGraph:
            first.append(weakref.ref(turn.graph))
            return turn

    real = conversation_module.assemble

    def assemble(turn: TurnGraph) -> object:
        alive_at_join.append(first[0]() is not None)
        return real(turn)

    monkeypatch.setattr(conversation_module, "assemble", assemble)
    monkeypatch.setattr(Promotion, "start", lambda self: None)  # still pending at the join
    vault = _vault(tmp_path)
    (vault / "docs" / "links.md").write_text("See [[plan-0]] and ![[plan-1]].\n", "utf-8")
    conv = Conversation("s", vault=vault, pipeline=Pipeline.default().with_stage(Record()))
    gc.disable()
    try:
        conv.turn("q", attach=[{"note": "docs/links.md"}, {"note": "docs/plan-2.md"}])
    finally:
        gc.enable()
    assert alive_at_join == [False]
    assert conv.library.get("note:docs/plan-2.md") is not None


def test_a_turn_without_background_promotion_leaves_it_to_the_first_use(
    tmp_path: Path,
) -> None:
    """``background=False`` hands nothing to the worker; the library is made when asked
    for, the same as the worker's."""
    vault = _vault(tmp_path)
    now = Conversation("s", vault=vault, budget=Budget(context_window=60_000))
    later = Conversation("s", vault=vault, budget=Budget(context_window=60_000))
    env = now.turn("q", attach=[{"note": "docs/plan-0.md"}], background=False)
    later.turn("q", attach=[{"note": "docs/plan-0.md"}])
    promotion = now._promotion
    assert promotion is not None and promotion._future is None  # not handed to the worker
    assert now.library == later.library and "note:docs/plan-0.md" in now.library
    assert env.report.turn == 1


def test_background_must_be_a_bool(tmp_path: Path) -> None:
    from pipeline import ArgumentError

    conv = Conversation("s", vault=_vault(tmp_path))
    with pytest.raises(ArgumentError, match="background"):
        conv.turn("q", background=1)  # type: ignore[arg-type]
    assert conv.state.history == ()
