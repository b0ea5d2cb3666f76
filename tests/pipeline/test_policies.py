"""Freshness and re-attach policies, and the carry-forward form of each class."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina import Conversation
from lamina.pipeline import Form, Policy, check_envelope
from lamina.pipeline.errors import ConfigError
from lamina.processors import note, selection

LONG = "# Long\n\n" + "\n\n".join(
    f"## Part {i}\n\n" + " ".join(f"Sentence {i}.{j} is about sync." for j in range(40))
    for i in range(8)
)


def test_pin_keeps_l2_bytes_and_sends_the_new_version_marked_newer(vault: Path) -> None:
    conv = Conversation(vault=vault)
    t1 = conv.turn("a", attach=[note("docs/auth.md")])
    t2 = conv.turn(
        "b",
        attach=[note("docs/auth.md")],
        vault_changes={"docs/auth.md": "# Auth\n\nNow 2 hours.\n"},
    )
    assert t2.l2.segments[0].text == conv.library.get("note:docs/auth.md").text  # type: ignore[union-attr]
    seg = t2.l3.segments[0]
    assert seg.form is Form.FULL and 'newer="true"' in seg.text and "Now 2 hours." in seg.text
    assert "Now 2 hours." not in t2.system_text
    assert t2.report.decisions[0].reason == "content changed; L2 entry pinned"
    check_envelope(t2, t1)


def test_refresh_replaces_the_entry_in_place_and_reports_it(vault: Path) -> None:
    conv = Conversation(vault=vault, policy=Policy(freshness="refresh"))
    conv.turn("a", attach=[note("docs/auth.md"), note("project-spec.md")])
    t2 = conv.turn("b", attach=[note("docs/auth.md")])
    t3 = conv.turn(
        "c",
        attach=[note("docs/auth.md")],
        vault_changes={"docs/auth.md": "# Auth\n\nNow 2 hours.\n"},
    )
    assert t3.l2.keys() == ("note:docs/auth.md", "note:project-spec.md")
    assert "Now 2 hours." in t3.system_text
    assert t3.l3.segments[0].form is Form.REFERENCE
    assert any(d.layer == "L2" and d.target == "note:docs/auth.md" for d in t3.report.decisions)
    assert not t3.system_text.startswith(t2.system_text)
    check_envelope(t3, t2, conv.policy)


def test_vault_changes_persist_into_later_turns_and_never_touch_disk(vault: Path) -> None:
    conv = Conversation(vault=vault)
    conv.turn("a", vault_changes={"docs/auth.md": "# Auth\n\nchanged\n"})
    env = conv.turn("b", attach=[note("docs/auth.md")])
    assert "changed" in env.user_text
    assert "changed" not in (vault / "docs/auth.md").read_text()


def test_large_recoverable_item_is_previewed_in_l2_and_resent_in_full_on_reattach(
    tmp_path: Path,
) -> None:
    (tmp_path / "long.md").write_text(LONG)
    conv = Conversation(vault=tmp_path)
    conv.turn("a", attach=[note("long.md")])
    env = conv.turn("b", attach=[note("long.md")])
    entry = env.l2.segments[0]
    assert entry.form is Form.PREVIEW and 'form="preview"' in entry.text
    assert entry.tokens < env.l3.segments[0].tokens
    assert env.l3.segments[0].form is Form.FULL and 'library="preview"' in env.l3.segments[0].text
    check_envelope(env)


def test_reattach_reference_policy_sends_only_a_reference(tmp_path: Path) -> None:
    (tmp_path / "long.md").write_text(LONG)
    conv = Conversation(vault=tmp_path, policy=Policy(reattach="reference"))
    conv.turn("a", attach=[note("long.md")])
    env = conv.turn("b", attach=[note("long.md")])
    assert env.l3.segments[0].form is Form.REFERENCE
    check_envelope(env, policy=conv.policy)


def test_large_selection_is_kept_in_l2_as_a_marked_excerpt_not_dropped() -> None:
    text = " ".join(f"word{i}" for i in range(4000))
    conv = Conversation()
    conv.turn("a", attach=[selection(text, source="notes/x.md")])
    env = conv.turn("b")
    (entry,) = env.l2.segments
    assert entry.form is Form.EXCERPT and not entry.recoverable
    assert "word0 " in entry.text and "word3999" in entry.text
    assert "cut" in entry.text


def test_small_selection_is_kept_verbatim_in_l2() -> None:
    conv = Conversation()
    conv.turn("a", attach=[selection("keep me", source="x.md", lines=(3, 4))])
    env = conv.turn("b")
    (entry,) = env.l2.segments
    assert entry.form is Form.FULL and "keep me" in entry.text and 'lines="3-4"' in entry.text


def test_policy_values_are_validated() -> None:
    with pytest.raises(ConfigError, match="policy.freshness"):
        Policy(freshness="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="policy.verbatim_tokens"):
        Policy(verbatim_tokens=0)
