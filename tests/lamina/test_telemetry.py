"""Spans of turn builds, captured with the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lamina import Conversation
from lamina.renderers import prefix_report
from lamina.telemetry import SPAN_NAME, Telemetry

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_each_build_emits_a_span_with_genai_and_lamina_attributes() -> None:
    provider, exporter = _provider()
    telemetry = Telemetry("conv-1", "anthropic", "claude-sonnet-4-6", tracer_provider=provider)
    conv = Conversation("You are terse.", vault=VAULT)
    first = telemetry.turn(conv, "Summarize", [{"note": "project-spec.md"}])
    conv.reply("A spec.")
    conv.set_system("You are very terse.")
    second = telemetry.turn(conv, "Again", [{"note": "glossary.md"}])
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [SPAN_NAME, SPAN_NAME]
    one, two = (dict(s.attributes or {}) for s in spans)
    assert one["gen_ai.conversation.id"] == "conv-1"
    assert one["gen_ai.provider.name"] == "anthropic"
    assert one["gen_ai.request.model"] == "claude-sonnet-4-6"
    assert one["lamina.turn"] == 1 and two["lamina.turn"] == 2
    assert one["lamina.prefix_hash"] == first.prefix_hash
    assert one["lamina.tokens.L2"] == first.l2.tokens
    assert one["lamina.tokens.L3"] == first.l3.tokens > 0
    assert one["lamina.break_reason"] == "first-turn"
    assert two["lamina.break_reason"] == "system-changed"
    report = prefix_report(first, second, conv.counter)
    assert two["lamina.common_prefix_tokens"] == report.common_prefix_tokens
    assert two["lamina.decisions"] == len(second.report.decisions) > 0
    assert isinstance(two["lamina.build_ms"], float) and two["lamina.build_ms"] >= 0


def test_without_an_sdk_nothing_is_recorded() -> None:
    """The API alone gives non-recording spans: the turn is built, no attributes computed."""
    telemetry = Telemetry("conv-2")
    conv = Conversation("You are terse.")
    envelope = telemetry.turn(conv, "Hello")
    assert envelope.turn == 1 and telemetry.enabled
    from opentelemetry import trace

    assert not trace.get_tracer("probe").start_span("probe").is_recording()


def test_without_the_api_it_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    telemetry = Telemetry("conv-3")
    assert not telemetry.enabled
    conv = Conversation("You are terse.")
    assert telemetry.turn(conv, "Hello").turn == 1
