"""Hostile calls to the Python API: a typed LaminaError, and the conversation unchanged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lamina import Conversation
from lamina.pipeline import Budget, LaminaError, SystemPrompt
from lamina.pipeline.errors import ArgumentError, ConfigError, NoteNotFound
from lamina.pipeline.tools import tool
from lamina.processors import note


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: Budget("100"), "budget.context_window"),  # type: ignore[arg-type]
        (lambda: Budget(None), "budget.context_window"),  # type: ignore[arg-type]
        (lambda: Budget(True), "budget.context_window"),
        (lambda: Budget(0), "budget.context_window"),
        (lambda: Budget(1000, 100, per_message_tokens=-500), "budget.per_message_tokens"),
        (lambda: Budget(1000, 100, priming_tokens=-1), "budget.priming_tokens"),
        (lambda: Budget(1000, "100"), "budget.reserve_output"),  # type: ignore[arg-type]
        (lambda: Budget(1000, 100, safety_margin="0.1"), "budget.safety_margin"),  # type: ignore[arg-type]
        (lambda: Budget.for_model(None), "model"),  # type: ignore[arg-type]
        (lambda: Budget.for_model("gpt-4o", bogus=1), "budget"),
        (lambda: Budget.for_model("gpt-4o", summary_tokens=256), "budget"),
        (lambda: Budget.for_model("gpt-4o", priming_tokens=-3), "budget.priming_tokens"),
    ],
)
def test_bad_budget_settings_are_config_errors(make: Callable[[], Budget], setting: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert caught.value.setting == setting


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda v: Conversation(5, vault=v), "system"),
        (lambda v: Conversation(SystemPrompt(None), vault=v), "system.stable"),  # type: ignore[arg-type]
        (lambda v: Conversation("s", vault=5), "vault"),
        (lambda v: Conversation("s", vault=v, budget=4096), "budget"),
        (lambda v: Conversation("s", vault=v, policy="pin"), "policy"),
        (lambda v: Conversation("s", vault=v, tokenizer=None), "tokenizer"),
    ],
)
def test_bad_conversation_arguments_are_argument_errors(
    make: Callable[[Path], Conversation], argument: str, vault: Path
) -> None:
    with pytest.raises(ArgumentError) as caught:
        make(vault)
    assert caught.value.argument == argument


CALLS: list[tuple[str, Callable[[Conversation], Any], type[LaminaError]]] = [
    ("turn(None)", lambda c: c.turn(None), ArgumentError),
    ("turn(bytes)", lambda c: c.turn(b".."), ArgumentError),
    ("turn(int)", lambda c: c.turn(42), ArgumentError),
    ("attach a str", lambda c: c.turn("q", attach="a.md"), ArgumentError),
    ("attach a mapping", lambda c: c.turn("q", attach={"note": "a.md"}), ArgumentError),
    ("attach an object", lambda c: c.turn("q", attach=[object()]), ArgumentError),
    ("attach None", lambda c: c.turn("q", attach=None), ArgumentError),
    ("tools=[object()]", lambda c: c.turn("q", tools=[object()]), ArgumentError),
    ("tools=[a note]", lambda c: c.turn("q", tools=[note("project-spec.md")]), ArgumentError),
    ("vault_changes list", lambda c: c.turn("q", vault_changes=["a.md"]), ArgumentError),
    ("vault_changes bytes", lambda c: c.turn("q", vault_changes={"a.md": b"x"}), ArgumentError),
    ("reply(None)", lambda c: c.reply(None), ArgumentError),
    ("reply(bytes)", lambda c: c.reply(b"x"), ArgumentError),
    ("set_system(stable=5)", lambda c: c.set_system(stable=5), ArgumentError),
    ("set_system(mutable=[])", lambda c: c.set_system(mutable=[]), ArgumentError),
    (
        "missing note with vault changes",
        lambda c: c.turn(
            "q", [note("missing.md")], vault_changes={"project-spec.md": "# CHANGED\n"}
        ),
        NoteNotFound,
    ),
    (
        "bad mapping after a good one",
        lambda c: c.turn(
            "q",
            [{"note": "docs/auth.md"}, {"note": "../outside.md"}],
            vault_changes={"docs/auth.md": "# CHANGED\n"},
        ),
        LaminaError,
    ),
]


@pytest.mark.parametrize(("label", "call", "error"), CALLS, ids=[c[0] for c in CALLS])
def test_hostile_call_raises_typed_error_and_leaves_conversation_unchanged(
    label: str, call: Callable[[Conversation], Any], error: type[LaminaError], vault: Path
) -> None:
    conv = Conversation("Be terse.", vault=vault)
    conv.turn("first", [{"note": "project-spec.md"}])
    before = conv.state
    with pytest.raises(error):
        call(conv)
    assert conv.state == before
    # Still usable, and the next turn is the one an untouched conversation builds.
    twin = Conversation("Be terse.", vault=vault)
    twin.turn("first", [{"note": "project-spec.md"}])
    for c in (conv, twin):
        c.reply("ok")
    expected = twin.turn("next", [{"note": "project-spec.md"}, {"note": "docs/auth.md"}])
    got = conv.turn("next", [{"note": "project-spec.md"}, {"note": "docs/auth.md"}])
    assert got.prefix_hash == expected.prefix_hash
    assert [s.text for s in got.l3.segments] == [s.text for s in expected.l3.segments]
    assert "CHANGED" not in "".join(s.text for s in got.l3.segments)


def test_a_failed_turn_keeps_no_vault_change(vault: Path) -> None:
    """The issue's case: the change given to a turn that raised must not reach the next."""
    conv = Conversation("s", vault=vault)
    with pytest.raises(NoteNotFound):
        conv.turn("q", [note("missing.md")], vault_changes={"project-spec.md": "CHANGED"})
    env = conv.turn("q", [note("project-spec.md")])
    assert "CHANGED" not in env.l3.segments[0].text
    assert conv.state.vault_changes == ()
    assert len(conv.history) == 1


def test_successful_turn_keeps_its_vault_change(vault: Path) -> None:
    conv = Conversation("s", vault=vault)
    conv.turn("q", vault_changes={"project-spec.md": "CHANGED"})
    assert conv.state.vault_changes == (("project-spec.md", "CHANGED"),)
    env = conv.turn("q2", [note("project-spec.md")])
    assert "CHANGED" in env.l3.segments[0].text


def test_tool_results_still_work(vault: Path) -> None:
    conv = Conversation("s", vault=vault)
    env = conv.turn("q", tools=[tool("search", {"q": "x"}, "found x")])
    assert any("found x" in s.text for s in env.l3.segments)
