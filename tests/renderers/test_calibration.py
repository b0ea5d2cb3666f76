"""Calibration: a provider whose true count is 1.2x Lamina's moves the margin there, from
the profile's 30%, without letting any turn overflow the window."""

from __future__ import annotations

import math
from pathlib import Path

from lamina import Conversation, load_conversation
from lamina.pipeline import Budget, Envelope
from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn
from lamina.pipeline.tokens import Calibration
from lamina.renderers import trace_document, usage_record

MODEL = "claude-sonnet-4-6"
TRUE_RATIO = 1.2


def _vault(root: Path, notes: int) -> Path:
    for i in range(notes):
        body = "\n\n".join(
            f"Section {j} of note {i}: the sync engine keeps revision {i * 10 + j} of each "
            f"file and resolves conflicts by vector clock, then writes a journal entry."
            for j in range(12)
        )
        (root / f"note-{i:02}.md").write_text(f"# Note {i}\n\n{body}\n", encoding="utf-8")
    return root


def _provider_count(counted: int) -> int:
    """The simulated provider's tokenizer: 1.2 tokens for each of Lamina's."""
    return math.ceil(counted * TRUE_RATIO)


def test_margin_settles_within_two_percent_and_no_turn_overflows(tmp_path: Path) -> None:
    budget = Budget.for_model(MODEL, context_window=6000, reserve_output=1000)
    assert budget.safety_margin == 0.30
    conv = Conversation("You answer from the notes.", vault=_vault(tmp_path, 20), budget=budget)
    envelopes: list[Envelope] = []
    margins: list[float] = []
    for i in range(20):
        env = conv.turn(f"What does note {i} say?", [{"note": f"note-{i:02}.md"}])
        envelopes.append(env)
        counted = conv.count_request(env)
        observed = _provider_count(counted)
        assert observed + budget.reserve_output <= budget.context_window, f"turn {i + 1}"
        response = {
            "input_tokens": observed,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": 20,
        }
        conv.record_usage(usage_record(envelopes, response, "anthropic", MODEL, counted=counted))
        conv.reply(f"Note {i} is about revisions.")
        assert conv.budget is not None
        margins.append(conv.budget.safety_margin)
    calibration = conv.calibration(MODEL)
    assert calibration is not None and calibration.samples == 20
    for margin in margins[1:]:
        assert abs((1 + margin) - TRUE_RATIO) <= 0.02 * TRUE_RATIO
    assert margins[-1] < 0.30  # the budget loosened from evidence
    trace = trace_document(envelopes, conv.counter, calibration=conv.state.calibration)
    assert trace["calibration"] == [
        {"model": MODEL, "margin": margins[-1], "prior": 0.30, "samples": 20}
    ]
    # The budget had to act: the window, not the attachments, decided what was sent.
    assert any(e.report.budget and e.report.budget.decisions for e in envelopes)


def test_calibration_is_bounded_and_takes_the_largest_recent_ratio() -> None:
    cal = Calibration("m", 0.3)
    assert cal.margin == 0.3
    cal = cal.observe(1000, 1100).observe(1000, 1250).observe(1000, 1150)
    assert cal.margin == 0.25
    assert Calibration("m", 0.3).observe(100, 500).margin == 0.9
    assert Calibration("m", 0.3).observe(1000, 800).margin == 0.0
    assert Calibration("m", 0.3).observe(0, 800) == Calibration("m", 0.3)
    for _ in range(8):
        cal = cal.observe(1000, 1100)
    assert cal.margin == 0.1  # older readings leave the window


def test_calibration_is_saved_with_the_conversation(tmp_path: Path) -> None:
    budget = Budget.for_model(MODEL, context_window=6000, reserve_output=1000)
    conv = Conversation("You answer.", vault=_vault(tmp_path, 1), budget=budget)
    env = conv.turn("Hi", [{"note": "note-00.md"}])
    counted = conv.count_request(env)
    response = {"input_tokens": _provider_count(counted), "cache_read_input_tokens": 0}
    conv.record_usage(usage_record([env], response, "anthropic", MODEL, counted=counted))
    store = SqliteStore(tmp_path / "s.db")
    store.create(ConversationInfo("c"))
    save_turn(store, "c", conv, env)
    loaded = load_conversation(store, "c", vault=tmp_path)
    assert loaded.calibration(MODEL) == conv.calibration(MODEL)
    assert loaded.budget is not None and conv.budget is not None
    assert loaded.budget.safety_margin == conv.budget.safety_margin != 0.30
    store.close()
