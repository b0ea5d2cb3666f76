"""The invariant checker catches each kind of broken envelope."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from lamina import Conversation
from lamina.pipeline import Envelope, Form, Layer, LayerName, check_envelope
from lamina.pipeline.errors import InvariantViolation
from lamina.pipeline.text import strip_reply
from lamina.processors import note


def _rebuild(env: Envelope, index: int, segments: tuple) -> Envelope:  # type: ignore[type-arg]
    layers = list(env.layers)
    layers[index] = Layer(LayerName(f"L{index + 1}"), segments, 0)
    return Envelope(env.turn, tuple(layers), env.report)  # type: ignore[arg-type]


@pytest.fixture
def two_turns(vault: Path) -> tuple[Envelope, Envelope]:
    conv = Conversation("sys", vault=vault)
    t1 = conv.turn("a", attach=[note("project-spec.md")])
    conv.reply("ok")
    t2 = conv.turn("b", attach=[note("project-spec.md"), note("docs/auth.md")])
    return t1, t2


def test_valid_envelopes_pass(two_turns: tuple[Envelope, Envelope]) -> None:
    t1, t2 = two_turns
    check_envelope(t1)
    check_envelope(t2, t1)


def test_duplicate_key_in_a_layer(two_turns: tuple[Envelope, Envelope]) -> None:
    _, t2 = two_turns
    bad = _rebuild(t2, 2, t2.l3.segments + t2.l3.segments[-1:])
    with pytest.raises(InvariantViolation, match="invariant 2") as err:
        check_envelope(bad)
    assert err.value.key == "note:docs/auth.md"


def test_reference_without_library_entry(two_turns: tuple[Envelope, Envelope]) -> None:
    _, t2 = two_turns
    bad = _rebuild(t2, 1, ())
    with pytest.raises(InvariantViolation, match="invariant 3.*not in L2"):
        check_envelope(bad)


def test_unchanged_full_resend_of_a_library_item(two_turns: tuple[Envelope, Envelope]) -> None:
    _, t2 = two_turns
    ref = t2.l3.segments[0]
    full = attrs.evolve(ref, form=Form.FULL)
    bad = _rebuild(t2, 2, (full, *t2.l3.segments[1:]))
    with pytest.raises(InvariantViolation, match="invariant 3.*sent again unchanged"):
        check_envelope(bad)


def test_context_markup_in_history(two_turns: tuple[Envelope, Envelope]) -> None:
    _, t2 = two_turns
    leaked = attrs.evolve(t2.l4.segments[1], text=t2.l2.segments[0].text)
    bad = _rebuild(t2, 3, (t2.l4.segments[0], leaked))
    with pytest.raises(InvariantViolation, match="invariant 4"):
        check_envelope(bad)


def test_library_shrinking_between_turns(vault: Path) -> None:
    conv = Conversation("sys", vault=vault)
    conv.turn("a", attach=[note("docs/auth.md")])
    other = conv.turn("b")
    with pytest.raises(InvariantViolation, match="invariant 5"):
        check_envelope(_rebuild(other, 1, ()), other)


def test_system_change_without_decision(two_turns: tuple[Envelope, Envelope]) -> None:
    t1, t2 = two_turns
    seg = attrs.evolve(t2.l1.segments[0], text="other system")
    bad = _rebuild(t2, 0, (seg,))
    with pytest.raises(InvariantViolation, match="invariant 5"):
        check_envelope(bad, t1)


def test_reported_system_change_is_allowed(vault: Path) -> None:
    conv = Conversation("sys", vault=vault)
    t1 = conv.turn("a")
    conv.set_system(mutable="memory: likes tea")
    t2 = conv.turn("b")
    assert t2.report.decisions[0].target == "system:mutable"
    check_envelope(t2, t1)


def test_attached_item_missing_from_l2_and_l3(two_turns: tuple[Envelope, Envelope]) -> None:
    _, t2 = two_turns
    bad = _rebuild(t2, 2, t2.l3.segments[:1])
    with pytest.raises(InvariantViolation, match="invariant 6.*note:docs/auth.md"):
        check_envelope(bad)


def test_reply_stripping_removes_context_and_tool_blocks() -> None:
    reply = (
        'Per <note key="note:a.md" title="A" path="a.md">\nsecret body\n</note> and '
        '<reference key="note:b.md" source="note" title="B"/>, plus '
        '<tool_result>{"hits": 3}</tool_result> done.'
    )
    assert strip_reply(reply) == (
        "Per [context: note:a.md] and [context: note:b.md], plus [tool_result omitted] done."
    )


def test_a_payload_over_its_budget_is_refused(vault: Path) -> None:
    from lamina.pipeline import Budget

    conv = Conversation("sys", vault=vault, budget=Budget(context_window=5000, reserve_output=500))
    env = conv.turn("a", attach=[note("project-spec.md")])
    check_envelope(env)
    assert env.report.budget is not None
    over = attrs.evolve(env.report.budget, effective=env.report.budget.limit + 1)
    bad = attrs.evolve(env, report=attrs.evolve(env.report, budget=over))
    with pytest.raises(InvariantViolation, match="invariant 7"):
        check_envelope(bad)
