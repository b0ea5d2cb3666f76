"""The request-renderer registry: built-in provider renderers, and the host's own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from lamina.pipeline import Budget, Envelope
from lamina.pipeline.errors import RegistryError
from lamina.pipeline.tokens import ModelProfile, TokenCounter
from lamina.renderers._layouts import Layout, Prompt, build_prompt
from lamina.renderers._providers import (
    RenderedRequest,
    RequestOptions,
    Ttl,
    anthropic_request,
    gemini_request,
    openai_chat_request,
    openai_responses_request,
    request_options,
)
from lamina.renderers._sent import settle_turns

__all__ = ["RequestRegistry", "RequestRenderer", "annotate_trace", "render_request"]

RequestRenderer = Callable[[Prompt, RequestOptions], RenderedRequest]


@attrs.frozen
class _Entry:
    renderer: RequestRenderer
    provider: str


class RequestRegistry:
    """Request renderers by name; each names the provider whose models and cache rules
    apply (``openai``, ``anthropic`` or ``gemini``)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def register(self, name: str, renderer: RequestRenderer, *, provider: str) -> None:
        if name in self._entries:
            raise RegistryError(name, "a request renderer is already registered under this name")
        if provider not in ("openai", "anthropic", "gemini"):
            raise RegistryError(name, f"unknown provider {provider!r} (openai, anthropic, gemini)")
        self._entries[name] = _Entry(renderer, provider)

    def get(self, name: str) -> RequestRenderer:
        return self._entry(name).renderer

    def provider(self, name: str) -> str:
        return self._entry(name).provider

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names())
            raise RegistryError(
                name, f"no request renderer with this name (known: {known})"
            ) from None

    @classmethod
    def builtin(cls) -> RequestRegistry:
        registry = cls()
        registry.register("openai", openai_chat_request, provider="openai")
        registry.register("openai-responses", openai_responses_request, provider="openai")
        registry.register("anthropic", anthropic_request, provider="anthropic")
        registry.register("gemini", gemini_request, provider="gemini")
        return registry


def render_request(
    envelopes: Envelope | Sequence[Envelope],
    renderer: str = "openai",
    model: str | None = None,
    *,
    layout: Layout = "default",
    registry: RequestRegistry | None = None,
    profile: ModelProfile | None = None,
    counter: TokenCounter | None = None,
    max_tokens: int | None = None,
    conversation_id: str | None = None,
    ttl: Ttl | None = None,
) -> RenderedRequest:
    """The request for the last envelope, rendered by ``renderer`` in ``layout``.

    Pass the conversation's envelopes so far for the append-only and naive layouts; the
    default layout needs only the current one. Without ``max_tokens``, a budgeted
    envelope's reserve is the output limit, so what is sent matches the budget.
    """
    reg = registry or RequestRegistry.builtin()
    envs = [envelopes] if isinstance(envelopes, Envelope) else list(envelopes)
    budget = envs[-1].report.budget if envs else None
    if max_tokens is None and budget is not None:
        max_tokens = budget.reserve_output
    options = request_options(
        reg.provider(renderer),
        model,
        profile=profile,
        counter=counter,
        max_tokens=max_tokens,
        conversation_id=conversation_id,
        ttl=ttl,
    )
    if counter is None and layout == "batched":
        counter = TokenCounter()
    return reg.get(renderer)(build_prompt(envs, layout, counter), options)


def annotate_trace(
    document: dict[str, Any],
    envelopes: Sequence[Envelope],
    counter: TokenCounter,
    *,
    provider: str | None = None,
    model: str | None = None,
    conversation_id: str | None = None,
    layout: Layout = "default",
    budget: Budget | None = None,
) -> dict[str, Any]:
    """Add ``"cache"`` (and, with ``provider``, ``"request"``: the body as it would be
    sent) to each turn of a ``trace_document``; returns the same document.

    The cached prefix is in the request's own count (``budget``'s framing, else OpenAI's).
    Another ``layout`` than the default counts each turn's request as that layout sends it:
    ``"tokens_total"`` and the cached prefix become that layout's, and the document says
    ``"layout"``, so a report built from it agrees with a replay under that layout."""
    from lamina.renderers._cache import prefix_reports, prompt_prefix_tokens, prompt_tokens

    reports = prefix_reports(envelopes, counter, budget=budget)
    previous: Prompt | None = None
    for i, (turn, report) in enumerate(zip(document["turns"], reports, strict=True)):
        turn["cache"] = report.trace()
        if layout != "default" or budget is not None:
            prompt = build_prompt(envelopes[: i + 1], layout, counter)
            turn["tokens_total"] = prompt_tokens(prompt, counter, budget)
        if layout != "default":
            turn.pop("sent", None)  # the bands are the default layout's request
            shared = prompt_prefix_tokens(previous, prompt, counter, budget)
            kept = previous is not None and _extends(previous, prompt)
            turn["cache"] = {
                "common_prefix_tokens": shared,
                "break_reason": None if kept or previous is None else report.break_reason,
            }
            previous = prompt
        if provider is not None:
            turn["request"] = render_request(
                envelopes[: i + 1],
                provider,
                model,
                counter=counter,
                conversation_id=conversation_id,
                layout=layout,
            ).body
    if layout != "default":
        document["layout"] = layout
    settle_turns(document["turns"])
    return document


def _extends(previous: Prompt, current: Prompt) -> bool:
    """Whether ``current`` repeats every message of ``previous`` (growth, not a break)."""
    before, after = previous.chat(), current.chat()
    return after[: len(before) - 1] == before[:-1] and (
        len(after) >= len(before) and after[len(before) - 1][1].startswith(before[-1][1])
    )
