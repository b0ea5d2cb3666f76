"""Tool results and retrieval chunks in the append-only and naive layouts: turn-scoped."""

from __future__ import annotations

from pathlib import Path

from lamina import Conversation
from lamina.pipeline import Envelope, Form
from lamina.pipeline._model.tools import hit, tool
from lamina.pipeline.tools import tool_turn
from lamina.renderers import build_prompt
from tests.conftest import write_vault

LONG = "# Manual\n\n" + "\n\n".join(
    f"## Part {i}\n\n" + " ".join(f"Step {i}.{j} syncs the notebook." for j in range(40))
    for i in range(8)
)
RESULT = "RESULT: three notes mention sync."
PASSAGE = "A passage about retries found by search."
SEARCH = tool("search", {"q": "sync"}, RESULT)
CHUNK = hit("note:docs/other.md", (1, 3), PASSAGE)


def _conv(tmp_path: Path) -> Conversation:
    vault = write_vault(tmp_path / "v", {"docs/manual.md": LONG, "a.md": "# A\n\nAlpha.\n"})
    return Conversation("Answer from the context.", vault=vault)


def _two_turns(tmp_path: Path, second_tools: bool) -> list[Envelope]:
    conv = _conv(tmp_path)
    first = tool_turn(conv, "Q1", [{"note": "a.md"}], tools=[SEARCH], hits=[CHUNK])
    conv.reply("R1")
    if second_tools:
        second = tool_turn(conv, "Q2", [{"note": "a.md"}], tools=[SEARCH], hits=[CHUNK])
    else:
        second = conv.turn("Q2", [{"note": "a.md"}])
    return [first, second]


def test_segments_carry_the_view_attributes(tmp_path: Path) -> None:
    conv = _conv(tmp_path)
    env = conv.turn("Q", [{"note": "docs/manual.md"}])
    path = (("path", "docs/manual.md"),)
    assert env.l3.segments[0].attributes == path
    assert conv.turn("Q2").l2.segments[0].attributes == path


def test_append_only_back_reference_keeps_the_path_attribute(tmp_path: Path) -> None:
    """The library holds a preview, so the pipeline re-sends the note in full; the
    append-only layout refers back to turn 1 with the same attributes it had."""
    conv = _conv(tmp_path)
    first = conv.turn("Q1", [{"note": "docs/manual.md"}])
    conv.reply("R1")
    second = conv.turn("Q2", [{"note": "docs/manual.md"}])
    assert second.l3.segments[0].form is Form.FULL
    last = build_prompt([first, second], "append-only").messages[-1].text
    assert (
        '<reference key="note:docs/manual.md" source="note" title="manual" path="docs/manual.md"/>'
    ) in last
    assert "Step 3.1 syncs" not in last


def test_append_only_sends_a_repeated_tool_result_and_chunk_again(tmp_path: Path) -> None:
    envs = _two_turns(tmp_path, second_tools=True)
    last = build_prompt(envs, "append-only").messages[-1].text
    assert RESULT in last and PASSAGE in last
    assert '<reference key="tool:' not in last
    assert '<reference key="note:docs/other.md#L1-3"' not in last
    assert '<reference key="note:a.md"' in last  # an ordinary note still refers back


def test_append_only_orders_the_user_message_like_the_default(tmp_path: Path) -> None:
    """One order of a user message in every layout: tool results, the references, the
    other blocks in L3 order (retrieval chunks among them), the query."""
    envs = _two_turns(tmp_path, second_tools=True)
    first, second = build_prompt(envs, "append-only").messages[::2]
    assert first.text.startswith("<tool ") and second.text.startswith("<tool ")
    assert first.text == envs[0].user_text  # turn 1: everything is new, nothing referred
    text = second.text  # turn 2: a.md refers back, ahead of this turn's chunk
    assert text.index(RESULT) < text.index('<reference key="note:a.md"') < text.index(PASSAGE)
    assert text.index(PASSAGE) < text.rindex("Q2")
    default = envs[1].user_text
    assert default.index(RESULT) < default.index('<reference key="note:a.md"')
    assert default.index('<reference key="note:a.md"') < default.index(PASSAGE)


def test_append_only_with_tools_extends_the_previous_request(tmp_path: Path) -> None:
    envs = _two_turns(tmp_path, second_tools=True)
    before = build_prompt(envs[:1], "append-only").messages
    after = build_prompt(envs, "append-only").messages
    assert [m.text for m in after[: len(before)]] == [m.text for m in before]


def test_naive_does_not_carry_tool_results_or_chunks_into_later_turns(tmp_path: Path) -> None:
    envs = _two_turns(tmp_path, second_tools=False)
    first = build_prompt(envs[:1], "naive").messages[-1].text
    assert RESULT in first and PASSAGE in first
    prompt = build_prompt(envs, "naive")
    assert all(RESULT not in m.text and PASSAGE not in m.text for m in prompt.messages)
    assert "Alpha." in prompt.messages[-1].text


def test_naive_puts_this_turns_tool_results_and_chunks_first(tmp_path: Path) -> None:
    envs = _two_turns(tmp_path, second_tools=True)
    text = build_prompt(envs, "naive").messages[-1].text
    assert text.startswith("<tool ")
    assert text.count(RESULT) == 1 and text.count(PASSAGE) == 1
    assert text.index(PASSAGE) < text.index('key="note:a.md"') < text.index("Q2")
