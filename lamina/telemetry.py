"""OpenTelemetry spans for turn builds, when ``opentelemetry-api`` is installed.

One span per build, named ``lamina.build_turn``, with the GenAI semantic conventions'
``gen_ai.conversation.id``, ``gen_ai.provider.name`` and ``gen_ai.request.model``, plus
``lamina.*`` attributes: the turn, tokens per layer and in total, the prefix hash, the
tokens shared with the previous request, the break reason, the number of decisions and
the build time. Lamina depends on the API only (extra ``otel``); without it, or without
an SDK configured by the host, nothing is emitted::

    telemetry = Telemetry("conv-42", "anthropic", "claude-sonnet-4-6")
    envelope = telemetry.turn(conversation, "What changed?", [{"note": "spec.md"}])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from lamina.pipeline import Conversation, Envelope
from lamina.pipeline.tokens import TokenCounter, request_tokens
from lamina.renderers import DEFAULT_MODELS, prefix_report

__all__ = ["SPAN_NAME", "Telemetry", "turn_attributes"]

SPAN_NAME = "lamina.build_turn"
_PROVIDER_NAMES = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini"}


def _tracer(provider: Any) -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace.get_tracer("lamina", tracer_provider=provider)


def turn_attributes(
    envelope: Envelope,
    previous: Envelope | None,
    counter: TokenCounter,
    *,
    conversation_id: str,
    provider: str,
    model: str,
) -> dict[str, str | int | float]:
    """The span attributes of one build (also usable with any other tracing library)."""
    report = prefix_report(previous, envelope, counter)
    attributes: dict[str, str | int | float] = {
        "gen_ai.conversation.id": conversation_id,
        "gen_ai.provider.name": _PROVIDER_NAMES.get(provider, provider),
        "gen_ai.request.model": model,
        "lamina.turn": envelope.turn,
        "lamina.prefix_hash": envelope.prefix_hash,
        "lamina.tokens_total": request_tokens(envelope, counter),
        "lamina.common_prefix_tokens": report.common_prefix_tokens,
        "lamina.break_reason": report.break_reason or "",
        "lamina.decisions": len(envelope.report.decisions),
    }
    for layer in envelope.layers:
        attributes[f"lamina.tokens.{layer.name}"] = layer.tokens
    return attributes


class Telemetry:
    """Builds turns inside spans; a no-op when ``opentelemetry`` is not installed."""

    def __init__(
        self,
        conversation_id: str,
        provider: str = "openai",
        model: str | None = None,
        *,
        tracer_provider: Any = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.provider = provider
        self.model = model or DEFAULT_MODELS.get(provider, "")
        self._tracer = _tracer(tracer_provider)
        self._previous: Envelope | None = None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def build(self, conversation: Conversation, make: Callable[[], Envelope]) -> Envelope:
        """Run ``make`` (which builds the conversation's next turn) inside a span."""
        if self._tracer is None:
            envelope = make()
            self._previous = envelope
            return envelope
        with self._tracer.start_as_current_span(SPAN_NAME) as span:
            started = time.perf_counter()
            envelope = make()
            elapsed = (time.perf_counter() - started) * 1000
            if span.is_recording():
                attributes = turn_attributes(
                    envelope,
                    self._previous,
                    conversation.counter,
                    conversation_id=self.conversation_id,
                    provider=self.provider,
                    model=self.model,
                )
                attributes["lamina.build_ms"] = round(elapsed, 3)
                span.set_attributes(attributes)
        self._previous = envelope
        return envelope

    def turn(
        self, conversation: Conversation, text: str, attach: Iterable[Any] = (), **options: Any
    ) -> Envelope:
        """``conversation.turn(text, attach, **options)`` inside a span."""
        return self.build(conversation, lambda: conversation.turn(text, attach, **options))
