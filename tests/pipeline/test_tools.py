"""Single-shot tool results: turn-scoped artifacts placed before references and the query."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import Conversation
from lamina.pipeline import Budget, Form, check_envelope
from lamina.pipeline._model.tools import ToolSources, tool, tool_artifact, tool_key
from lamina.pipeline.errors import AttachmentError
from lamina.pipeline.tools import tool_turn

SEARCH = "\n".join(f"Result {i}: the sync service retries failed pushes." for i in range(40))


def _conv(vault: Path, **kw: object) -> Conversation:
    return Conversation("You are terse.", vault=vault, **kw)  # type: ignore[arg-type]


def test_key_is_name_and_hash_of_canonical_args() -> None:
    a = tool_key("search", {"q": "sync", "k": 3})
    assert a == tool_key("search", '{"k": 3, "q": "sync"}')
    assert a.startswith("tool:search:") and len(a.split(":")[2]) == 16
    assert a != tool_key("search", {"q": "sync", "k": 4})


def test_tool_result_is_recoverable_unless_the_host_says_otherwise() -> None:
    assert tool_artifact("fetch", {"u": "x"}, "body").recoverable
    assert not tool_artifact("paste", {}, "body", recoverable=False).recoverable


def test_bad_tool_name_or_args_raise_attachment_error() -> None:
    with pytest.raises(AttachmentError, match="tool name"):
        tool("bad name", {}, "")
    with pytest.raises(AttachmentError, match="JSON object"):
        tool("search", "[1, 2]", "")


def test_tool_results_come_before_references_and_the_query(vault: Path) -> None:
    conv = _conv(vault)
    conv.turn("Read this", [{"note": "docs/auth.md"}])
    conv.reply("Read.")
    env = tool_turn(
        conv,
        "How long do tokens live?",
        [{"note": "docs/auth.md"}],
        tools=[tool("search", {"q": "tokens"}, SEARCH)],
    )
    text = env.user_text
    tool_at = text.index('<tool key="tool:search:')
    ref_at = text.index("<reference")
    query_at = text.index("How long do tokens live?")
    assert tool_at < ref_at < query_at
    check_envelope(env)


def test_tool_output_never_in_system_message_or_history(vault: Path) -> None:
    conv = _conv(vault)
    env = tool_turn(conv, "Search please", tools=[tool("search", {"q": "sync"}, SEARCH)])
    conv.reply("Found it.")
    later = conv.turn("Thanks")
    assert SEARCH not in env.system_text and SEARCH in env.user_text
    assert all(SEARCH not in s.text for s in later.l4.segments)
    assert all(not s.key.startswith("tool:") for s in later.l2.segments)
    assert later.history()[0] == ("user", "Search please")
    check_envelope(later, env)


def test_prefix_is_byte_identical_with_and_without_tools(vault: Path) -> None:
    def run(with_tools: bool) -> tuple[str, str]:
        conv = _conv(vault)
        conv.turn("Spec", [{"note": "project-spec.md"}])
        conv.reply("ok")
        tools = [tool("search", {"q": "sync"}, SEARCH)] if with_tools else []
        env = tool_turn(conv, "And sync?", [{"note": "docs/api-docs.md"}], tools=tools)
        conv.reply("done")
        nxt = conv.turn("Next")
        return env.system_text, nxt.system_text

    assert run(True) == run(False)


def test_budget_compacts_a_tool_result_to_a_stub_with_name_and_args(vault: Path) -> None:
    big = "\n\n".join(f"## Hit {i}\n\n" + "Sync detail sentence. " * 60 for i in range(12))
    conv = _conv(vault, budget=Budget(context_window=1200, reserve_output=200))
    env = tool_turn(conv, "Summarize", tools=[tool("search", {"q": "sync"}, big)])
    seg = env.l3.segments[0]
    assert seg.source_type == "tool" and seg.form is not Form.FULL
    assert seg.key in seg.text and 'name="search"' in seg.text
    assert any(d.stage == "budget" and d.target == seg.key for d in env.report.decisions)


def test_script_form_of_a_tool_parses_through_tool_sources(vault: Path) -> None:
    conv = _conv(vault)
    sources = ToolSources(conv.sources)
    spec = sources.parse({"tool": "search", "args": {"q": "x"}, "result": "r"})
    assert spec.describe() == 'tool search({"q":"x"})'
    assert sources.process(spec).artifacts[0].key == tool_key("search", {"q": "x"})
