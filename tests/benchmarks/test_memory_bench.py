"""The ``memory`` bench point, small: on one LoCoMo conversation, recall reaches more of
the answer-bearing messages than keeping the newest, without lowering the cached share."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from benchmarks.memory import locomo_chat, locomo_dir, main, measure_memory, memory_targets
from lamina.pipeline.recall import Bm25Retriever, RecallItem

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


class CountingRetriever:
    """A host's retriever for the command's test: Lamina's BM25, counting its searches."""

    searches = 0

    def __init__(self) -> None:
        self._inner = Bm25Retriever()

    def index(self, items: Sequence[RecallItem]) -> None:
        self._inner.index(items)

    def search(self, query: str, k: int) -> Sequence[tuple[str, float]]:
        CountingRetriever.searches += 1
        return self._inner.search(query, k)


def test_the_command_measures_a_host_retriever(capsys: pytest.CaptureFixture[str]) -> None:
    """``--retriever MODULE:NAME`` puts a host's retriever (embeddings, say) in place of
    the default for the recall-on conversations; the document names it."""
    CountingRetriever.searches = 0
    named = f"{__name__}:CountingRetriever"
    assert main(["4096", "--conversations", "47", "--questions", "3", "--retriever", named]) == 0
    memory = json.loads(capsys.readouterr().out)
    assert memory["retriever"] == named and memory["questions"] == 3
    assert CountingRetriever.searches > 3  # the chat's turns and the questions
    for bad, says in (
        (["--retriever", "nocolon"], "is not MODULE:NAME"),
        (["--retriever", f"{__name__}:Nope"], "Nope"),
        (["--questions", "0"], "at least 1"),
    ):
        with pytest.raises(SystemExit):
            main(bad)
        assert says in capsys.readouterr().err
