"""Provider request bodies (OpenAI, Anthropic, Gemini) and the cache rules they share.

The rules table is data: the minimum cacheable prefix and the cached-read price per model
come from the model profiles; the rest from the providers' caching guides:
- OpenAI (platform.openai.com/docs/guides/prompt-caching; cookbook "Prompt Caching 201"):
  automatic for prompts of 1,024+ tokens, hits in 128-token steps; cached input is billed
  at 50% (gpt-4o), 25% (gpt-4.1, o3, o4-mini) or 10% (gpt-5) of the input price.
- Anthropic (docs.claude.com/en/docs/build-with-claude/prompt-caching): up to 4
  ``cache_control`` breakpoints; a hit is an exact prefix up to a block boundary, looked
  up at most 20 blocks before each breakpoint; writes cost 1.25x (5-minute TTL) or 2x
  (1-hour TTL), reads 0.1x of the input price.
- Gemini (ai.google.dev/gemini-api/docs/caching; Vertex AI context-cache overview):
  implicit prefix caching above the model's minimum (2,048 for 2.5 Flash/Pro in the
  latest revision), cached tokens billed at 10% (90% discount); an explicit
  ``cachedContent`` holds the system instruction, and a request that uses it cannot send
  its own ``systemInstruction``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from lamina.pipeline.errors import ConfigError
from lamina.pipeline.text import text_hash
from lamina.pipeline.tokens import ModelProfile, Provider, TokenCounter, get_profile
from lamina.renderers._layouts import HISTORY_END, L1_STABLE, SYSTEM_END, TURN_END, Block, Prompt

__all__ = [
    "DEFAULT_MODELS",
    "CacheRules",
    "GeminiCachePlan",
    "RenderedRequest",
    "RequestOptions",
    "Ttl",
    "anthropic_breakpoints",
    "anthropic_request",
    "cache_rules",
    "flat_blocks",
    "gemini_cache_plan",
    "gemini_request",
    "openai_chat_request",
    "openai_responses_request",
    "prompt_cache_key",
    "request_options",
]

Ttl = Literal["5m", "1h"]

DEFAULT_MODELS: dict[str, str] = {
    "openai": "gpt-4.1",
    "anthropic": "claude-sonnet-4-6",
    "gemini": "gemini-2.5-flash",
}

_HOUR_WRITE = 2.0
"""Anthropic's cache write with the 1-hour TTL (the profile's ``cache_write`` is the
5-minute one's)."""


@attrs.frozen
class CacheRules:
    """How one provider/model caches prompt prefixes and what cached tokens cost.

    ``step``: hits are counted in multiples of it (1 = exact); ``read``/``write``: price
    of a cached read / cache write as a share of the plain input price; ``breakpoints``
    and ``lookback``: Anthropic's explicit markers (0 = automatic prefix caching).
    """

    provider: Provider
    model: str
    min_tokens: int
    step: int = 1
    read: float = 1.0
    write: float = 1.0
    breakpoints: int = 0
    lookback: int = 0


def cache_rules(profile: ModelProfile, ttl: Ttl | None = None) -> CacheRules:
    """The rules for ``profile``'s model (see the module docstring for sources); a cached
    read costs ``ModelProfile.cache_read`` of the input price, a write ``cache_write``."""
    read, write, least = profile.cache_read, profile.cache_write, profile.min_cacheable_tokens
    if profile.provider == "openai":
        return CacheRules("openai", profile.name, least, 128, read, write)
    if profile.provider == "anthropic":
        write = _HOUR_WRITE if ttl == "1h" else write
        return CacheRules("anthropic", profile.name, least, 1, read, write, 4, 20)
    return CacheRules("gemini", profile.name, least, 1, read, write)


@attrs.frozen
class RequestOptions:
    """What a request renderer needs besides the prompt."""

    model: str
    profile: ModelProfile
    counter: TokenCounter = attrs.field(factory=TokenCounter, eq=False)
    max_tokens: int | None = None
    conversation_id: str | None = None
    ttl: Ttl | None = None

    @property
    def rules(self) -> CacheRules:
        return cache_rules(self.profile, self.ttl)

    @property
    def output_limit(self) -> int:
        """The output limit every body sends: ``max_tokens`` (the budget's reserve when the
        request comes from a budgeted envelope), else the profile's reserve, capped at the
        model's maximum output."""
        limit = self.max_tokens
        if limit is None:
            limit = self.profile.default_output_reserve
        cap = self.profile.max_output_tokens
        return limit if cap is None else min(limit, cap)


def request_options(
    provider: str,
    model: str | None = None,
    *,
    profile: ModelProfile | None = None,
    counter: TokenCounter | None = None,
    max_tokens: int | None = None,
    conversation_id: str | None = None,
    ttl: Ttl | None = None,
) -> RequestOptions:
    """Options with the provider's default model and that model's profile."""
    if provider not in DEFAULT_MODELS:
        raise ConfigError(
            "provider", f"unknown provider {provider!r} (known: openai, anthropic, gemini)"
        )
    name = model or DEFAULT_MODELS[provider]
    prof = profile or get_profile(name)
    if prof.provider != provider:
        raise ConfigError("model", f"{name!r} is a {prof.provider} model, not {provider}")
    if ttl not in (None, "5m", "1h"):
        raise ConfigError("ttl", f"must be '5m' or '1h', got {ttl!r}")
    return RequestOptions(
        name,
        prof,
        counter or TokenCounter(prof.tokenizer),
        max_tokens,
        conversation_id,
        ttl,
    )


@attrs.frozen
class RenderedRequest:
    """A request as it goes on the wire: the path after the API base and the JSON body."""

    provider: str
    path: str
    body: dict[str, Any] = attrs.field(hash=False)


def prompt_cache_key(conversation_id: str) -> str:
    """A stable OpenAI ``prompt_cache_key`` for a conversation (no raw ids leave the host)."""
    return "lamina-" + text_hash(conversation_id)[:24]


def _with_cache_key(body: dict[str, Any], options: RequestOptions) -> dict[str, Any]:
    if options.conversation_id is not None:
        body["prompt_cache_key"] = prompt_cache_key(options.conversation_id)
    return body


def openai_chat_request(prompt: Prompt, options: RequestOptions) -> RenderedRequest:
    """Chat Completions: one system message (L1 + L2), history, then the user message."""
    messages = [{"role": role, "content": text} for role, text in prompt.chat()]
    body: dict[str, Any] = {"model": options.model, "messages": messages}
    body["max_completion_tokens"] = options.output_limit
    return RenderedRequest("openai", "/chat/completions", _with_cache_key(body, options))


def openai_responses_request(prompt: Prompt, options: RequestOptions) -> RenderedRequest:
    """Responses API: the system text as ``instructions``, the messages as ``input``."""
    body: dict[str, Any] = {"model": options.model}
    if prompt.system_text:
        body["instructions"] = prompt.system_text
    body["input"] = [{"role": m.role, "content": m.text} for m in prompt.messages]
    body["max_output_tokens"] = options.output_limit
    return RenderedRequest("openai", "/responses", _with_cache_key(body, options))


def flat_blocks(prompt: Prompt) -> list[tuple[int, Block]]:
    """Every block in request order with its message index (-1 for the system blocks)."""
    out: list[tuple[int, Block]] = [(-1, b) for b in prompt.system]
    for i, message in enumerate(prompt.messages):
        out.extend((i, b) for b in message.blocks)
    return out


_ANCHORS = (L1_STABLE, SYSTEM_END, HISTORY_END, TURN_END)


def anthropic_breakpoints(
    prompt: Prompt, counter: TokenCounter, min_tokens: int, limit: int = 4
) -> tuple[int, ...]:
    """Indices into ``flat_blocks(prompt)`` that get ``cache_control``.

    Candidates are the anchored blocks (end of L1-stable, end of the system blocks, the
    last history message, and in the append-only layout the end of this turn); one is
    used only when the prefix up to it has at least ``min_tokens`` tokens (counted with
    ``counter``; Claude's tokenizer yields more tokens than o200k, so this errs on the
    side of a real prefix being at least as long). At most ``limit`` are kept, the
    latest ones, since a later breakpoint's look-back covers earlier boundaries.
    """
    chosen: list[int] = []
    total = 0
    for i, (_, block) in enumerate(flat_blocks(prompt)):
        total += counter.count(block.text)
        if block.anchor in _ANCHORS and total >= min_tokens:
            chosen.append(i)
    return tuple(chosen[-limit:])


def _text_block(text: str, cache: dict[str, str] | None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if cache is not None:
        block["cache_control"] = dict(cache)
    return block


def anthropic_request(prompt: Prompt, options: RequestOptions) -> RenderedRequest:
    """Messages API: ``system`` as blocks (L1 stable, L1 mutable, the library heading and
    one block per L2 entry) so a grown library still meets last turn's breakpoint within
    the 20-block look-back; breakpoints from ``anthropic_breakpoints``."""
    rules = options.rules
    marks = set(anthropic_breakpoints(prompt, options.counter, rules.min_tokens, rules.breakpoints))
    cache: dict[str, str] = {"type": "ephemeral"}
    if options.ttl == "1h":
        cache["ttl"] = "1h"
    flat = flat_blocks(prompt)
    system = [
        _text_block(b.text, cache if i in marks else None)
        for i, (m, b) in enumerate(flat)
        if m == -1
    ]
    messages: list[dict[str, Any]] = []
    for j, message in enumerate(prompt.messages):
        content = [
            _text_block(b.text, cache if i in marks else None)
            for i, (m, b) in enumerate(flat)
            if m == j
        ]
        messages.append({"role": message.role, "content": content})
    body: dict[str, Any] = {"model": options.model, "max_tokens": options.output_limit}
    if system:
        body["system"] = system
    body["messages"] = messages
    return RenderedRequest("anthropic", "/v1/messages", body)


def _contents(prompt: Prompt) -> list[dict[str, Any]]:
    return [
        {"role": "model" if m.role == "assistant" else "user", "parts": [{"text": m.text}]}
        for m in prompt.messages
    ]


def _generation_config(body: dict[str, Any], options: RequestOptions) -> dict[str, Any]:
    # google-genai always sends the generationConfig; so do we, so the SDK's wire body and
    # ours are equal.
    body["generationConfig"] = {"maxOutputTokens": options.output_limit}
    return body


def gemini_request(prompt: Prompt, options: RequestOptions) -> RenderedRequest:
    """``generateContent``: ``contents`` with user/model roles, the system text as
    ``systemInstruction`` (implicit caching needs nothing else)."""
    body: dict[str, Any] = {"contents": _contents(prompt)}
    if prompt.system_text:
        body["systemInstruction"] = {"parts": [{"text": prompt.system_text}]}
    body = _generation_config(body, options)
    return RenderedRequest("gemini", f"/v1beta/models/{options.model}:generateContent", body)


@attrs.frozen
class GeminiCachePlan:
    """An explicit Gemini cache for L1 + L2: the ``cachedContents`` create body, and the
    ``generateContent`` request that uses it (without its own ``systemInstruction``).

    ``create`` is None when the system text is under the model's minimum: then
    ``request`` is the plain request and implicit caching is all there is.
    """

    display_name: str
    system_tokens: int
    create: RenderedRequest | None
    request: RenderedRequest


def gemini_cache_plan(
    prompt: Prompt,
    options: RequestOptions,
    cache_name: str | None = None,
    ttl_seconds: int = 3600,
) -> GeminiCachePlan:
    """Plan an explicit cache; ``cache_name`` is the name the create call returned (a
    placeholder derived from the system text's hash until the host has one)."""
    system = prompt.system_text
    tokens = options.counter.count(system)
    display = "lamina-" + text_hash(system)[:16]
    if not system or tokens < options.rules.min_tokens:
        return GeminiCachePlan(display, tokens, None, gemini_request(prompt, options))
    create_body: dict[str, Any] = {
        "model": f"models/{options.model}",
        "displayName": display,
        "systemInstruction": {"parts": [{"text": system}]},
        "ttl": f"{ttl_seconds}s",
    }
    create = RenderedRequest("gemini", "/v1beta/cachedContents", create_body)
    body: dict[str, Any] = {
        "contents": _contents(prompt),
        "cachedContent": cache_name or f"cachedContents/{display}",
    }
    body = _generation_config(body, options)
    path = f"/v1beta/models/{options.model}:generateContent"
    return GeminiCachePlan(display, tokens, create, RenderedRequest("gemini", path, body))
