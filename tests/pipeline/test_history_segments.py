"""L4 kept between turns: reused segments, running counts and hashes equal a fresh build."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lamina import Conversation
from lamina.pipeline import Budget, HistoryEntry, Segment
from lamina.pipeline._model.envelope import BLOCK_SEP, Form
from lamina.pipeline._turn.history import HistorySegments
from lamina.pipeline.text import text_hash
from lamina.pipeline.tokens import CountMemo, TokenCounter

# Texts whose edges exercise the blank-line rule: trailing punctuation, leading spaces,
# slashes, newlines, non-ASCII.
_EDGES = st.sampled_from(["", " ", "\n", "/", "!", "?)", ".", "é", "  x", "\t"])
_TEXT = st.builds(
    lambda a, body, b: a + body + b,
    _EDGES,
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40),
    _EDGES,
)


def _segment(counter: TokenCounter, calls: list[tuple[int, str]]):  # type: ignore[no-untyped-def]
    def make(turn: int, role: str, text: str, shorten_to: int | None) -> Segment:
        calls.append((turn, role))
        shown = text if shorten_to is None else text[:shorten_to] + " [cut]"
        return Segment(
            f"history:{turn}:{role}",
            Form.TEXT,
            "history",
            text_hash(shown),
            shown,
            counter.count(shown),
            role=role,
        )

    return make


_STEP = st.one_of(
    st.tuples(st.just("say"), _TEXT, st.one_of(st.none(), _TEXT)),
    st.tuples(st.just("start"), st.integers(0, 3), st.none()),
    st.tuples(st.just("shorten"), st.integers(1, 12), st.none()),
)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=25), limit=st.integers(1, 6))
def test_kept_segments_counts_and_hashes_equal_a_fresh_build(
    steps: list[tuple[str, object, object]], limit: int
) -> None:
    counter = TokenCounter(memo=CountMemo())
    kept = HistorySegments()
    history: tuple[HistoryEntry, ...] = ()
    start, shortened = 1, ()
    for kind, a, b in steps:
        if kind == "say":
            assert isinstance(a, str) and (b is None or isinstance(b, str))
            history = (*history, HistoryEntry(len(history) + 1, a, b))
        elif kind == "start":
            assert isinstance(a, int)
            start += a  # the cut point only moves forward
        else:
            assert isinstance(a, int)
            shortened = tuple(sorted({*shortened, a}))
        calls: list[tuple[int, str]] = []
        got = kept.segments(counter, history, start, shortened, limit, _segment(counter, calls))
        fresh = HistorySegments().segments(
            counter, history, start, shortened, limit, _segment(counter, [])
        )
        assert [(s.key, s.text, s.tokens) for s in got] == [
            (s.key, s.text, s.tokens) for s in fresh
        ]
        joined = BLOCK_SEP.join(s.text for s in got if s.text)
        assert kept.tokens(counter, got) in (None, counter.count(joined))
        assert kept.layer_hash(got) == text_hash(joined)
        if kind == "say":  # a new entry: only its own messages are made
            assert set(calls) <= {(len(history), "user"), (len(history), "assistant")}


def test_a_warm_turn_counts_only_the_new_history_messages() -> None:
    # Recall off: a recalling turn counts its new passages (the recall tests' concern).
    budget = Budget(context_window=8_000, reserve_output=0, recall=False)
    conv = Conversation("You are terse.", budget=budget)
    for i in range(12):
        conv.turn(f"question {i}: what about item {i}?")
        conv.reply(" ".join([f"Item {i} is fine."] * (i + 1)))
    encoded, looked_up = conv.counter.encoded_chars, conv.counter.hits
    env = conv.turn("and now?")
    # Only the last turn's reply is new to L4 (its question was counted as last turn's
    # query): 22 older messages are neither encoded nor looked up again.
    new = len("and now?") + len(" ".join(["Item 11 is fine."] * 12))
    assert conv.counter.encoded_chars - encoded == new
    assert conv.counter.hits - looked_up < 12
    assert len(env.l4.segments) == 24
    assert env.l4.tokens == TokenCounter(memo=CountMemo()).count(env.l4.text)
    assert env.l4.hash == text_hash(env.l4.text)


def test_l4_follows_history_cuts_like_a_restored_conversation() -> None:
    budget = Budget(context_window=600, reserve_output=0, recall=False)
    conv = Conversation("You are terse.", budget=budget)
    starts = set()
    for i in range(30):
        query = f"question {i}?"
        restored = Conversation.restore(conv.state, budget=budget)  # nothing kept
        env = conv.turn(query)
        again = restored.turn(query)
        assert env.l4 == again.l4  # segments, count and hash
        assert env.l4.tokens == TokenCounter(memo=CountMemo()).count(env.l4.text)
        assert env.l4.hash == text_hash(env.l4.text)
        starts.add(env.l4.segments[0].key if env.l4.segments else "")
        conv.reply(f"Answer {i}: " + "word " * (20 * (i % 5)))
    assert len(starts) > 2  # the history was cut more than once
