"""Promotion off the critical path: a turn returns before its new items are in L2, and the
library the next turn starts from is the same whether the background thread made it or not."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lamina import Conversation
from lamina.pipeline import Budget, Library
from lamina.pipeline._turn.promotion import Promotion, _worker
from lamina.pipeline.errors import ArgumentError, StageError
from tests.forked import in_forked_child

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

    # The one worker is held until released by a job that is not a promotion's step: a
    # make holds the step lock (``promotion._step``), so with the blocker's make under
    # way the queued one would wait for it, and the worker winning the race to start it
    # failed this test on a loaded machine ([1, 2]).
    gate = _worker().submit(release.wait, 10)
    blocker = Promotion(make)
    blocker.start()  # queued behind the gate until released
    queued = Promotion(lambda: made.append(2) or Library())  # type: ignore[func-returns-value]
    queued.start()
    assert made == []
    # Not begun by the worker: made here, once, and the worker's turn does nothing.
    assert queued.result() == Library()
    assert made == [2]
    release.set()
    assert gate.result(10)
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

    import lamina.pipeline._conversation.conversation as conversation_module
    from lamina.pipeline import Pipeline, TurnGraph

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
    from lamina.pipeline.errors import ArgumentError

    conv = Conversation("s", vault=_vault(tmp_path))
    with pytest.raises(ArgumentError, match="background"):
        conv.turn("q", background=1)  # type: ignore[arg-type]
    assert conv.state.history == ()


def test_extending_a_library_is_appending_its_entries_one_by_one() -> None:
    from lamina.pipeline import Form, LibraryEntry, View

    def entry(i: int) -> LibraryEntry:
        view = View(f"note:n{i}.md", "note", Form.FULL, f"n{i}", f"n{i}.md", True, f"h{i}")
        return LibraryEntry(view, f"<n{i}/>", 3, 1)

    base = Library((entry(0),))
    new = [entry(i) for i in range(1, 5)]
    appended = base
    for e in new:
        appended = appended.append(e)
    extended = base.extend(new)
    assert extended == appended
    assert [extended.get(f"note:n{i}.md") for i in range(5)] == list(appended)
    assert "note:n4.md" in extended and "note:n5.md" not in extended
    with pytest.raises(ArgumentError, match=r"note:n2\.md is already in the library"):
        extended.extend([entry(5), entry(2)])
    with pytest.raises(ArgumentError, match=r"note:n6\.md is already in the library"):
        base.extend([entry(6), entry(6)])


def _logged(log: list[str], name: str, steps: int = 0) -> tuple[
    Callable[[], Library], Callable[[Library], Iterator[None]]
]:
    """A promotion's make and prepare that log their work (the prepare yields before each
    step, as ``_prepare_summaries`` does)."""

    def make() -> Library:
        log.append(f"make {name}")
        return Library()

    def prepare(_: Library) -> Iterator[None]:
        for i in range(steps):
            yield
            log.append(f"prepare {name}.{i}")

    return make, prepare


def test_the_next_turn_stops_the_preparing_and_the_rest_goes_on_after_its_library() -> None:
    """A promotion's preparing (work for later turns) stops at its next step when the next
    turn asks for the library; what is left runs after the next promotion's library, before
    that promotion's own preparing."""
    log: list[str] = []
    first = Promotion(*_logged(log, "1", 3))
    assert first.result(next_turn=True) == Library()
    assert log == ["make 1"]  # stopped before its first step's work
    assert len(first.rest) == 1
    second = Promotion(*_logged(log, "2", 2))
    second.carry(first.rest)
    assert second.result() == Library()
    assert log == ["make 1", "make 2", "prepare 1.0", "prepare 1.1", "prepare 1.2",
                   "prepare 2.0", "prepare 2.1"]  # fmt: skip
    assert second.rest == ()
    # A turn waited for at once carries nothing: its preparing is not run at all.
    third = Promotion(*_logged(log, "3", 1))
    third.without_preparing()
    third.carry(first.rest)
    assert third.result() == Library() and log[-1] == "make 3"


def test_a_turn_right_after_a_large_promotion_waits_for_its_library_not_its_ranking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn after one that filled half the window asks for the library while the
    worker still ranks its new entries: the ranking stops after the entry it is on, goes
    on after that turn's library, and the requests are those waiting for all of it gives.
    The worker's first entry goes on once the turn has asked (not on a clock started
    before it: a loaded machine took longer to get there)."""
    from lamina.pipeline.tokens import TokenCounter
    from lamina.pipeline.views import TextRankSummarizer, summary_pool
    from lamina.renderers import openai_messages

    gate, entered = threading.Event(), threading.Event()
    ranked: list[str] = []

    class Gated(TextRankSummarizer):
        def prepare(self, text: str) -> None:
            entered.set()
            gate.wait(10)  # the worker's first ranking waits until the next turn asks
            ranked.append(text)
            super().prepare(text)

    asked = Promotion.result

    def result(self: Promotion, *, next_turn: bool = False) -> Library:
        if next_turn and not gate.is_set():
            # Opened once this call has stopped the ranking (its first statement): on a
            # timer of 0.2 s, a loaded machine opened it first and two entries ran.
            stop = self._stop

            def opened() -> None:
                stop.wait(10)
                gate.set()

            threading.Thread(target=opened, daemon=True).start()
        return asked(self, next_turn=next_turn)

    monkeypatch.setattr(Promotion, "result", result)
    vault = _vault(tmp_path)
    sent = {}
    for wait in (True, False):
        summary_pool().clear()
        gate.clear()
        entered.clear()
        ranked.clear()
        summarizer = Gated(TokenCounter())
        conv = Conversation("s", vault=vault, budget=Budget(6_000, 500), summarizer=summarizer)
        first = conv.turn("q", [{"note": f"docs/plan-{i}.md"} for i in range(4)])
        conv.reply("a")
        if wait:
            gate.set()
            _ = conv.library  # all of the ranking before the next turn
            assert len(ranked) == 4
        else:
            assert entered.wait(10)  # the worker is on its first entry
        second = conv.turn("again?")
        assert len(ranked) == (4 if wait else 1)  # stopped after the entry it was on
        _ = conv.library  # the rest ran after the second turn's library
        assert len(ranked) == 4
        sent[wait] = [openai_messages(first), openai_messages(second)]
    assert sent[False] == sent[True]


def test_a_process_forked_while_the_worker_prepares_makes_the_library_itself() -> None:
    """The worker holds the promotion's lock through its preparing; a child forked then has
    no worker, so a lock inherited held would leave its next turn waiting forever."""
    preparing = threading.Event()
    steps = 0

    def prepare(_: Library) -> Iterator[None]:
        nonlocal steps
        for _ in range(3_000):  # 30 s of steps: still preparing when the child is done
            yield
            steps += 1
            preparing.set()
            threading.Event().wait(0.01)

    promotion = Promotion(Library, prepare)
    promotion.start()
    assert preparing.wait(10)
    assert in_forked_child(lambda: promotion.result(next_turn=True)) == Library()
    assert promotion.result(next_turn=True) == Library()
    assert 0 < steps < 3_000  # the parent's worker was still preparing when it forked
