"""Retrieval hits: chunks keyed by source and range, referenced when L2 holds them in full."""

from __future__ import annotations

from pathlib import Path

from lamina import Conversation
from lamina.pipeline import Form, Policy, check_envelope
from lamina.pipeline._model.tools import chunk_source, hit, tool
from lamina.pipeline.tools import tool_turn
from tests.conftest import write_vault

LONG = "# Manual\n\n" + "\n\n".join(
    f"## Part {i}\n\n" + " ".join(f"Step {i}.{j} syncs the notebook." for j in range(40))
    for i in range(8)
)
CHUNK = " ".join(f"Step 2.{j} syncs the notebook." for j in range(40))
SMALL = "# Small\n\nline two\n" + "\n".join(
    f"Fact {i}: pushes retry after {i} seconds." for i in range(30)
)
SMALL_CHUNK = "\n".join(f"Fact {i}: pushes retry after {i} seconds." for i in range(5, 25))


def _conv(tmp_path: Path) -> Conversation:
    vault = write_vault(tmp_path / "v", {"docs/small.md": SMALL, "docs/manual.md": LONG})
    return Conversation("Answer from the hits.", vault=vault, policy=Policy(verbatim_tokens=600))


def test_chunk_key_names_source_and_range() -> None:
    artifact = hit("note:docs/a.md", (10, 40), "text").artifact()
    assert artifact.key == "note:docs/a.md#L10-40"
    assert chunk_source(artifact.key) == "note:docs/a.md"
    assert chunk_source("note:docs/a.md") is None


def test_chunk_of_a_note_in_l2_in_full_is_a_reference_and_saving_reported(tmp_path: Path) -> None:
    conv = _conv(tmp_path)
    first = conv.turn("Read", [{"note": "docs/small.md"}])
    conv.reply("ok")
    env = tool_turn(
        conv, "When do pushes retry?", hits=[hit("note:docs/small.md", (8, 27), SMALL_CHUNK)]
    )
    seg = env.l3.get("note:docs/small.md#L8-27")
    assert seg is not None and seg.form is Form.REFERENCE
    assert SMALL_CHUNK not in env.user_text
    saved = env.report.stat("retrieval_tokens_saved")
    assert saved > 100
    assert any(d.target == seg.key and d.tokens_saved == saved for d in env.report.decisions)
    check_envelope(env, first)


def test_chunk_overlapping_an_l2_preview_is_sent_and_marked(tmp_path: Path) -> None:
    conv = _conv(tmp_path)
    conv.turn("Read", [{"note": "docs/manual.md"}])
    conv.reply("ok")
    assert conv.library.get("note:docs/manual.md").form is Form.PREVIEW  # type: ignore[union-attr]
    env = tool_turn(conv, "What does part 2 say?", hits=[hit("note:docs/manual.md", (7, 7), CHUNK)])
    seg = env.l3.get("note:docs/manual.md#L7-7")
    assert seg is not None and seg.form is Form.FULL
    assert 'overlaps="note:docs/manual.md"' in seg.text and 'library="preview"' in seg.text
    assert CHUNK in env.user_text


def test_duplicate_chunks_across_tools_are_sent_once(tmp_path: Path) -> None:
    conv = _conv(tmp_path)
    same = hit("note:docs/other.md", (1, 3), "Shared passage about retries.")
    env = tool_turn(
        conv,
        "Retries?",
        tools=[
            tool("search", {"q": "retry"}, hits=[same]),
            tool("grep", {"p": "retr"}, hits=[same]),
        ],
    )
    assert env.user_text.count("Shared passage about retries.") == 1
    assert env.report.stat("duplicates_removed") == 1
    assert env.report.stat("retrieval_tokens_saved") > 0


def test_retrieval_chunks_never_enter_the_library(tmp_path: Path) -> None:
    conv = _conv(tmp_path)
    tool_turn(conv, "Q", hits=[hit("note:docs/x.md", (1, 2), "A passage.")])
    conv.reply("A.")
    assert conv.library.keys() == ()
    assert conv.history[0].user == "Q"


def test_qa_mode_sends_hits_before_the_question(tmp_path: Path) -> None:
    conv = _conv(tmp_path)
    env = tool_turn(
        conv,
        "Which facts?",
        hits=[
            hit("note:docs/x.md", (1, 2), "First passage."),
            hit("note:docs/y.md", (4, 9), "Second."),
        ],
    )
    text = env.user_text
    assert text.index("First passage.") < text.index("Second.") < text.index("Which facts?")
    assert env.system_text == "Answer from the hits."
    check_envelope(env)


def test_chunk_of_a_note_sent_in_full_this_turn_is_dropped_and_saving_reported(
    tmp_path: Path,
) -> None:
    """The note is beside it in the same message: the chunk would send its lines twice."""
    conv = _conv(tmp_path)
    env = tool_turn(
        conv,
        "When do pushes retry?",
        [{"note": "docs/small.md"}],
        hits=[hit("note:docs/small.md", (8, 27), SMALL_CHUNK)],
    )
    assert env.l3.keys() == ("note:docs/small.md",)
    assert env.user_text.count("Fact 5: pushes retry") == 1
    saved = env.report.stat("retrieval_tokens_saved")
    assert saved > 100
    (drop,) = [d for d in env.report.decisions if d.target == "note:docs/small.md#L8-27"]
    assert (drop.to_form, drop.tokens_saved) == ("dropped", saved)
    check_envelope(env)


def test_chunk_not_found_in_the_note_sent_this_turn_is_still_sent(tmp_path: Path) -> None:
    conv = _conv(tmp_path)
    env = tool_turn(
        conv,
        "Q",
        [{"note": "docs/small.md"}],
        hits=[hit("note:docs/small.md", (2, 2), "A line the index saw before an edit.")],
    )
    assert "A line the index saw before an edit." in env.user_text
    assert env.report.stat("retrieval_tokens_saved") == 0
