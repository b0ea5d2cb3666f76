"""The three-turn walkthrough of CONTEXT_ENGINEERING.md, as a test."""

from __future__ import annotations

from pathlib import Path

from lamina import Conversation
from lamina.pipeline import Form, check_envelope
from lamina.pipeline.text import has_context_markup
from lamina.processors import note
from lamina.renderers import openai_messages


def test_three_turn_walkthrough(vault: Path) -> None:
    conv = Conversation("You are helpful.", vault=vault)

    t1 = conv.turn("Summarize this", attach=[note("project-spec.md")])
    assert t1.l2.segments == ()
    assert [(s.key, s.form) for s in t1.l3.segments] == [("note:project-spec.md", Form.FULL)]
    conv.reply("Here is a summary of the project spec.")

    t2 = conv.turn(
        "What endpoints does the API support?",
        attach=[note("project-spec.md"), note("docs/api-docs.md")],
    )
    assert t2.l2.keys() == ("note:project-spec.md",)
    assert [(s.key, s.form) for s in t2.l3.segments] == [
        ("note:project-spec.md", Form.REFERENCE),
        ("note:docs/api-docs.md", Form.FULL),
    ]
    conv.reply("The API supports the following endpoints...")

    t3 = conv.turn("Explain the auth flow from the spec", attach=[note("project-spec.md")])
    assert t3.l2.keys() == ("note:project-spec.md", "note:docs/api-docs.md")
    assert [(s.key, s.form) for s in t3.l3.segments] == [("note:project-spec.md", Form.REFERENCE)]

    assert t3.system_text.startswith(t2.system_text)
    assert t2.system_text.startswith(t1.system_text)
    for seg in t3.l4.segments:
        assert not has_context_markup(seg.text)
    assert [role for role, _ in t3.history()] == ["user", "assistant", "user", "assistant"]
    assert t3.history()[0] == ("user", "Summarize this")
    for prev, env in ((None, t1), (t1, t2), (t2, t3)):
        check_envelope(env, prev)


def test_messages_follow_the_layer_order(vault: Path) -> None:
    conv = Conversation("You are helpful.", vault=vault)
    conv.turn("first", attach=[note("project-spec.md")])
    conv.reply("ok")
    env = conv.turn("second", attach=[note("project-spec.md"), note("docs/auth.md")])
    messages = openai_messages(env)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system, user = messages[0]["content"], messages[-1]["content"]
    # The library's growth waits for the next break: turn 1's note stays in the message
    # that sent it, and the request extends turn 1's byte for byte.
    assert system == "You are helpful."
    assert messages[1]["content"].startswith('<note key="note:project-spec.md"')
    assert user.startswith("Context attached to this message (sent in full earlier")
    assert '<reference key="note:project-spec.md" source="note"' in user
    assert user.index("<reference") < user.index('<note key="note:docs/auth.md"')
    assert user.endswith("---\n[User query]:\nsecond")
    # As built, the note is in the library at the front of the request.
    assert env.system_text.startswith("You are helpful.\n\n# Context Library\n")
    assert '<note key="note:project-spec.md"' in env.system_text


def test_a_turn_without_context_sends_the_bare_query(vault: Path) -> None:
    conv = Conversation(vault=vault)
    env = conv.turn("hello")
    assert openai_messages(env) == [{"role": "user", "content": "hello"}]
