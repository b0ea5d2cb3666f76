"""The cyclic collector held off while the budget stage makes its ladders: on inside the
block only as the host left it, restored after the last of nested or concurrent blocks."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Sequence

import pytest

from lamina.pipeline import Budget, Conversation
from lamina.pipeline._collector import paused
from lamina.pipeline.recall import Bm25Retriever
from lamina.renderers import XmlRenderer


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if was:  # as the test found it, whatever the test left
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_inside_and_on_after() -> None:
    with paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_still_restores_it() -> None:
    with pytest.raises(ValueError, match="inside"), paused():
        raise ValueError("inside")
    assert gc.isenabled()


def test_a_nested_block_leaves_it_off_until_the_outer_one_ends() -> None:
    with paused():
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_host_turned_off_stays_off() -> None:
    gc.disable()
    with paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_blocks_in_threads_turn_it_on_once_the_last_ends() -> None:
    entered, first_left = threading.Barrier(2), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with paused():
            entered.wait(5)
        first_left.set()

    def second() -> None:
        with paused():
            entered.wait(5)
            assert first_left.wait(5)
            seen.append(gc.isenabled())  # the first left; this block still holds it off

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [False]
    assert gc.isenabled()


class _Recording(Bm25Retriever):
    """BM25 that records whether the collector was on when the budget stage asked it."""

    states: list[bool] = []  # noqa: RUF012 (one list per test: reset there)

    def search(self, query: str, k: int) -> Sequence[tuple[str, float]]:
        _Recording.states.append(gc.isenabled())
        return super().search(query, k)


def test_the_budget_stage_runs_with_the_collector_off() -> None:
    _Recording.states = []
    budget = Budget(context_window=1_200, reserve_output=200)
    conv = Conversation(
        "You are helpful.", renderer=XmlRenderer(), budget=budget, retriever=_Recording
    )
    for i in range(30):
        conv.turn(f"My sister Maria moved to Lisbon in year {i}." if i == 0 else f"Busy day {i}.")
        conv.reply("Noted. " + "Sounds good. " * 10)
    conv.turn("Where did Maria move to?")
    assert _Recording.states  # recall asked the retriever, inside the stage
    assert not any(_Recording.states)
    assert gc.isenabled()
