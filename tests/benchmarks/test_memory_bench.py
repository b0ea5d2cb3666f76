"""The ``memory`` bench point, small: recall reaches what the user said long ago."""

from __future__ import annotations

from benchmarks.memory import MEMORY_TARGETS, measure_memory, memory_chat

SEED = 20260


def test_the_chat_is_long_multi_session_and_annotated() -> None:
    chat = memory_chat(SEED)
    assert 2 * len(chat.turns) >= 300
    asked = chat.questions
    assert len(asked) >= 20
    for number in asked:
        turn = chat.turns[number - 1]
        (answer,) = turn.answers
        assert number - answer >= 16  # asked at least a session later
        assert turn.user not in chat.turns[answer - 1].user  # asked in other words


def test_recall_reaches_the_answers_at_8k_and_16k() -> None:
    """The share targets (not times: those are the bench's), beside trim_messages."""
    memory = measure_memory(SEED, (8_192, 16_384), cache=False)
    assert memory["messages"] >= 300 and memory["tokens"] >= 15_000
    at = {w["window"]: w for w in memory["windows"]}
    assert at[8_192]["reached_on"] >= MEMORY_TARGETS["recall_8k"]
    assert at[16_384]["reached_on"] >= MEMORY_TARGETS["recall_16k"]
    for w in memory["windows"]:
        # Recall off keeps the newest messages, as trim_messages does.
        assert w["reached_off"] == w["trim_messages"]
        assert w["reached_on"] > w["reached_off"] or w["reached_off"] == 1.0
        assert 0 < w["recalled_tokens_mean"] <= 0.3 * w["limit"]
