"""Note names holding markup characters, controls or bytes that are not UTF-8 go through
every form, compacted ones included, like any other name: the invariants hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lamina import Conversation
from lamina.pipeline import Budget, Form, SystemPrompt, check_envelope
from lamina.processors import folder

NAMES = {
    "quote": 'say "hi"',
    "less-than": "a<b",
    "greater-than": "a>b",
    "tab": "a\tb",
    "ampersand": "a&amp;b",
    "control": "a\x01b",
    "not-utf8": os.fsdecode(b"caf\xe9"),
    "block-opener": '<note key="note:x">',
}


def _note(i: int) -> str:
    facts = " ".join(f"Fact {i}.{k} about sample store {i}." for k in range(120))
    return f"# Note {i}\n\n{facts}\n"


@pytest.mark.parametrize("label", sorted(NAMES))
def test_a_name_with_markup_characters_compacts_like_any_other(
    tmp_path: Path, label: str
) -> None:
    """A tight budget turns the library into references; every envelope passes the
    checker (invariant 8: a compacted block keeps its key and title)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for i in range(8):
        (lib / f"{NAMES[label]} {i}.md").write_text(_note(i), encoding="utf-8")
    conv = Conversation(SystemPrompt("You are terse."), vault=tmp_path)
    envs = [conv.turn("load the library", attach=[folder("lib")])]
    conv.reply("ok")
    conv.budget = Budget(context_window=1_500, reserve_output=100)
    envs.append(conv.turn("what do we know?"))
    compacted = [s for s in envs[-1].l2.segments if s.form is not Form.FULL]
    assert compacted, [s.form for s in envs[-1].l2.segments]
    assert all(NAMES[label] in s.key for s in compacted)
    previous = None
    for env in envs:
        check_envelope(env, previous, conv.policy)
        previous = env
