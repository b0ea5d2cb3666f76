"""The ``memory`` bench point, small: on one LoCoMo conversation, recall reaches more of
the answer-bearing messages than keeping the newest, without lowering the cached share."""

from __future__ import annotations

import json

import pytest

from benchmarks.memory import locomo_chat, locomo_dir, main, measure_memory, memory_targets

DATA = locomo_dir()
pytestmark = pytest.mark.skipif(
    DATA is None, reason="LoCoMo not found at ../shared/data/locomo-dev (or $LAMINA_LOCOMO)"
)


def test_a_conversation_replays_as_turns_with_its_questions() -> None:
    assert DATA is not None
    chat = locomo_chat(DATA / "26.json")
    texts = chat.texts
    assert len(texts) == 419 and len(chat.sessions) == 19
    assert texts["D1:1"] == "Caroline: Hey Mel! Good to see you! How have you been?"
    assert chat.turns[0].user == ("D1:1", texts["D1:1"])
    assert chat.turns[0].reply is not None and chat.turns[0].reply[0] == "D1:2"
    assert all(e in texts for q in chat.questions for e in q.evidence)
    assert len(chat.questions) >= 190


def test_recall_reaches_more_than_the_newest_messages_on_one_conversation() -> None:
    memory = measure_memory(0, (8_192,), conversations=("26",), questions=40)
    (row,) = memory["windows"]
    assert memory["questions"] == 40
    assert row["reached_on"] > row["trim_messages"] and row["reached_on"] > row["reached_off"]
    assert 0 <= row["bm25"] <= 1
    # The retriever with the whole room and each match's neighbours: the targets' reference.
    assert row["bm25"] <= row["whole_room"] <= 1
    names = {t["target"] for t in memory_targets(memory)}
    assert "answer-bearing messages reached" in names


def test_recall_does_not_lower_the_cached_share() -> None:
    """Conversation 26 at 8k: a passage only fills room, or a suffix cut it pays for."""
    memory = measure_memory(0, (8_192,), conversations=("26",), questions=40)
    (row,) = memory["windows"]
    assert row["cached_share_on"] >= row["cached_share_off"]


def test_the_command_measures_the_conversations_it_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m benchmarks.memory 4096 --conversations 47``: the docs' held-out rows are
    measured apart from the tuned ones; a conversation not in the data is refused."""
    assert main(["4096", "--conversations", "47"]) == 0
    memory = json.loads(capsys.readouterr().out)
    assert memory["data"] == "LoCoMo 47"
    assert [row["window"] for row in memory["windows"]] == [4096]
    with pytest.raises(SystemExit):
        main(["--conversations", "12"])
    assert "12 not among 26, 41, 43, 47, 49" in capsys.readouterr().err
