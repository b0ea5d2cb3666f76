"""Markdown transcripts: literal export, round trip, and imports that report what is lost."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lamina import (
    Conversation,
    export_transcript,
    import_transcript,
    parse_transcript,
    render_transcript,
)
from lamina.pipeline import SystemPrompt
from lamina.pipeline.errors import ChatTranscriptError
from lamina.pipeline.store import (
    ChatMessage,
    ChatTranscript,
    ConversationInfo,
    SqliteStore,
    Store,
    save_turn,
)
from lamina.processors import Sources
from tests.conftest import write_vault
from tests.stores import BACKENDS, Backend

PLUGIN = """---
epoch: 1712345678901
modelKey: gpt-4o|openai
topic: "Sync questions"
tags:
  - copilot-conversation
---

**user**: What does the spec say?
[Context: Notes: project-spec.md, auth.md | URLs: {url}]
[Timestamp: 2024/04/05 12:34:56]

**ai**: It describes the sync service.
[Timestamp: 2024/04/05 12:34:58]

**user**: And tokens?
[Timestamp: 2024/04/05 12:35:10]
"""


def test_render_is_the_documented_markdown() -> None:
    transcript = ChatTranscript(
        conversation_id="c1",
        model="gpt-4o",
        created="2026-01-02T03:04:05Z",
        tags=("work",),
        messages=(
            ChatMessage(
                "user",
                "Hi\n**ai**: not a message",
                (("note", "a.md"), ("url", "https://x.y/")),
                "T1",
            ),
            ChatMessage("ai", "Hello", (), "T2"),
        ),
    )
    assert render_transcript(transcript) == (
        "---\n"
        "conversation_id: c1\n"
        "model: gpt-4o\n"
        "created: '2026-01-02T03:04:05Z'\n"
        "tags:\n"
        "- work\n"
        "---\n"
        "\n"
        "**user**: Hi\n"
        "\\**ai**: not a message\n"
        "[Context: Notes: a.md | URLs: https://x.y/]\n"
        "[Timestamp: T1]\n"
        "\n"
        "**ai**: Hello\n"
        "[Timestamp: T2]\n"
    )


def test_parse_undoes_render() -> None:
    transcript = ChatTranscript(
        conversation_id="c1",
        system=SystemPrompt("stable", "mutable"),
        messages=(
            ChatMessage("user", "a\n\n[Timestamp: fake]\n\\**user**: x", (("tag", "#t"),), "T", 10),
            ChatMessage("ai", "", (), "", 16),
        ),
    )
    assert parse_transcript(render_transcript(transcript)) == transcript


def test_the_agents_l1_text_is_in_the_frontmatter() -> None:
    """What an agent framework's adapter set in L1 (``agent_system``) and what the last
    requests sent after a handoff (``agent_handoff``) are written after ``system`` and
    read back, so a resumed conversation sends the same bytes."""
    transcript = ChatTranscript(
        conversation_id="c1",
        system=SystemPrompt("Be terse.", "Route each question."),
        messages=(ChatMessage("user", "Hi", (), "", 11),),
        agent_system="Route each question.",
        agent_handoff="Dig through the notes.",
    )
    text = render_transcript(transcript)
    assert text == (
        "---\n"
        "conversation_id: c1\n"
        "model: ''\n"
        "created: ''\n"
        "tags: []\n"
        "system:\n"
        "  stable: Be terse.\n"
        "  mutable: Route each question.\n"
        "agent_system: Route each question.\n"
        "agent_handoff: Dig through the notes.\n"
        "---\n"
        "\n"
        "**user**: Hi\n"
    )
    assert parse_transcript(text) == transcript


def _store_chat(store: Store, vault: Path) -> None:
    store.create(ConversationInfo("orig", "2026-01-01T00:00:00Z", "gpt-4o", ("a", "b"), "Title"))
    conv = Conversation(SystemPrompt("Be terse.", "Memory"), vault=vault)
    turns = [
        ("Summarize\n**user**: quoted marker", [{"note": "project-spec.md"}], "A spec."),
        ("Docs?", [{"tag": "#security"}, {"folder": "docs"}], None),
        ("More", [{"note": "docs/api-docs.md"}], "See <tool_result>x</tool_result> ok"),
    ]
    for i, (user, attach, reply) in enumerate(turns):
        env = conv.turn(user, attach)
        if reply is not None:
            conv.reply(reply)
        save_turn(store, "orig", conv, env, attach, created=f"T{i}", reply_created=f"R{i}")


@pytest.mark.parametrize("source", BACKENDS)
@pytest.mark.parametrize("target", BACKENDS)
def test_export_import_export_is_identical(
    new_backend: Callable[[str], Backend], vault: Path, source: str, target: str
) -> None:
    """Saved in either backend, imported into either: the same transcript and state."""
    with new_backend(source).open() as a:
        _store_chat(a, vault)
        first = export_transcript(a, "orig")
        state = a.load("orig")
    with new_backend(target).open() as b:
        report = import_transcript(first, b, vault=vault)
        assert report.problems == ()
        assert report.turns == 3
        assert export_transcript(b, "orig") == first
        # Same texts, notes, system and (category-ordered) attachments: the same state.
        assert b.load("orig") == state


def test_missing_note_is_reported_and_kept_in_the_transcript(backend: Backend, vault: Path) -> None:
    text = "**user**: hi\n[Context: Notes: project-spec.md, gone.md]\n[Timestamp: t]\n"
    with backend.open() as store:
        report = import_transcript(text, store, vault=vault, conversation_id="m")
        assert [(p.turn, p.kind, p.label) for p in report.problems] == [(1, "note", "gone.md")]
        assert "no such note" in report.problems[0].reason
        assert store.load("m").library[0].key == "note:project-spec.md"
        assert "[Context: Notes: project-spec.md, gone.md]" in export_transcript(store, "m")


def test_ambiguous_basename_is_reported_with_candidates(tmp_path: Path) -> None:
    vault = write_vault(
        tmp_path / "v", {"x/plan.md": "# X\n", "y/plan.md": "# Y\n", "z/only.md": "# Z\n"}
    )
    text = "**user**: hi\n[Context: Notes: plan.md, only.md]\n"
    with SqliteStore(tmp_path / "s.db") as store:
        report = import_transcript(text, store, vault=vault, conversation_id="m")
        (problem,) = report.problems
        assert problem.label == "plan.md"
        assert "ambiguous basename: matches x/plan.md, y/plan.md" in problem.reason
        assert report.rebuilt == ("note z/only.md",)


@pytest.mark.parametrize(
    "stamp",
    [
        "yesterday, 5pm (CET)",
        "2024-13-45 99:99:99",
        "a]b",
        "   spaced  ",
        "午後3時",
        "1712345678901",
    ],
)
def test_odd_timestamps_survive_verbatim(backend: Backend, vault: Path, stamp: str) -> None:
    text = f"**user**: hi\n[Timestamp: {stamp}]\n\n**ai**: yo\n[Timestamp: {stamp}!]\n"
    with backend.open() as store:
        import_transcript(text, store, vault=vault, conversation_id="t")
        (record,) = store.turns("t")
        assert (record.created, record.reply_created) == (stamp, stamp + "!")
        out = export_transcript(store, "t")
    assert f"[Timestamp: {stamp}]\n\n**ai**: yo\n[Timestamp: {stamp}!]\n" in out


def test_reply_without_a_question_is_reported(backend: Backend, vault: Path) -> None:
    text = "**ai**: Welcome!\n\n**user**: hi\n\n**ai**: one\n\n**ai**: two\n"
    with backend.open() as store:
        report = import_transcript(text, store, vault=vault, conversation_id="r")
        assert [p.label for p in report.problems] == ["line 1", "line 7"]
        assert all(p.turn == 0 for p in report.problems)
        assert store.load("r").history[0].assistant == "one"


def test_selection_is_rebuilt_only_from_the_store(
    backend: Backend, new_backend: Callable[[str], Backend], vault: Path
) -> None:
    with backend.open() as store:
        store.create(ConversationInfo("src"))
        conv = Conversation("", vault=vault)
        attach = [{"selection": "the picked text", "source": "a.md"}]
        save_turn(store, "src", conv, conv.turn("look", attach), attach)
        text = export_transcript(store, "src")
        report = import_transcript(text, store, vault=vault, conversation_id="copy")
        assert report.problems == ()
        assert store.load("copy").library == store.load("src").library
    with new_backend(backend.name).open() as other:
        report = import_transcript(text, other, vault=vault)
        (problem,) = report.problems
        assert problem.kind == "selection"
        assert "not in the store" in problem.reason


@pytest.fixture
def page_url() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (
                b"<html><head><title>Sync</title></head><body><p>Sync page body.</p></body></html>"
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/page"
    server.shutdown()


def test_plugin_transcript_imports_without_fetching(
    backend: Backend, vault: Path, page_url: str
) -> None:
    with backend.open() as store:
        report = import_transcript(PLUGIN.format(url=page_url), store, vault=vault)
        info = store.conversation(report.conversation_id)
        assert (info.model, info.title, info.tags) == (
            "gpt-4o|openai",
            "Sync questions",
            ("copilot-conversation",),
        )
        assert info.created == "2024-04-05T19:34:38Z"
        assert report.rebuilt == ("note project-spec.md", "note docs/auth.md")
        (problem,) = report.problems
        assert (problem.kind, problem.label) == ("url", page_url)
        assert "not allowed" in problem.reason
        records = store.turns(report.conversation_id)
        assert [(r.user, r.reply, r.created) for r in records] == [
            ("What does the spec say?", "It describes the sync service.", "2024/04/05 12:34:56"),
            ("And tokens?", None, "2024/04/05 12:35:10"),
        ]


def test_plugin_transcript_fetches_urls_when_allowed(
    backend: Backend, vault: Path, page_url: str
) -> None:
    sources = Sources.for_vault(vault, allow_private_network=True)
    with backend.open() as store:
        report = import_transcript(
            PLUGIN.format(url=page_url), store, sources=sources, allow_fetch=True
        )
        assert report.problems == ()
        keys = [e.key for e in store.load(report.conversation_id).library]
        assert any(k.startswith("url:http://127.0.0.1") for k in keys)


def test_malformed_frontmatter_names_the_line() -> None:
    with pytest.raises(ChatTranscriptError, match=r"chat\.md:3: malformed YAML"):
        parse_transcript("---\ntags: [a\nmodel: x\n---\n**user**: hi\n", "chat.md")


def test_text_before_the_first_message_is_refused() -> None:
    with pytest.raises(ChatTranscriptError, match=r"chat\.md:1: text before the first"):
        parse_transcript("hello\n**user**: hi\n", "chat.md")


def test_crlf_inside_a_message_survives_the_round_trip(tmp_path: Path, vault: Path) -> None:
    """A message's CRLF line ends stay CRLF (a Lamina export writes LF between its lines)."""
    transcript = ChatTranscript(
        conversation_id="c1",
        messages=(
            ChatMessage("user", "one\r\ntwo\r\n\r\nthree\rfour", (), "T", 6),
            ChatMessage("ai", "a\r\nb", (), "", 8),
        ),
    )
    assert parse_transcript(render_transcript(transcript)) == transcript
    with SqliteStore(tmp_path / "a.db") as a:
        a.create(ConversationInfo("crlf", "T0", "gpt-4o"))
        conv = Conversation("", vault=vault)
        env = conv.turn("line 1\r\nline 2")
        conv.reply("reply 1\r\nreply 2")
        save_turn(a, "crlf", conv, env, [], created="T1", reply_created="R1")
        first = export_transcript(a, "crlf")
    with SqliteStore(tmp_path / "b.db") as b:
        import_transcript(first, b, vault=vault)
        assert [(r.user, r.reply) for r in b.turns("crlf")] == [
            ("line 1\r\nline 2", "reply 1\r\nreply 2")
        ]
        assert export_transcript(b, "crlf") == first


def test_a_file_saved_with_crlf_line_ends_reads_like_the_lf_file() -> None:
    crlf = PLUGIN.format(url="https://x.y/").replace("\n", "\r\n")
    assert parse_transcript(crlf) == parse_transcript(PLUGIN.format(url="https://x.y/"))
    assert parse_transcript(crlf).messages[1].text == "It describes the sync service."
