"""Agent-loop requests: the envelope's request plus native tool-call and tool-result messages.

Each step becomes the assistant's call message followed by its results, in the shape
each API validates: OpenAI chat (``tool_calls`` + ``role: tool``), OpenAI Responses
(``function_call`` + ``function_call_output`` items), Anthropic (``tool_use`` blocks, then
one user message of ``tool_result`` blocks) and Gemini (``functionCall`` parts, then one
user content of ``functionResponse`` parts). Calls and results are never separated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from lamina.pipeline.agent import AgentTurn, Loop, LoopStep
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.tokens import ModelProfile, TokenCounter
from lamina.renderers._providers import RenderedRequest, RequestOptions, Ttl, request_options
from lamina.renderers._requests import render_request

__all__ = [
    "AGENT_RENDERERS",
    "ANTHROPIC_TOOL_PROMPT",
    "agent_request",
    "anthropic_tool_prompt",
    "instructions_tokens",
    "loop_messages",
    "tool_tokens",
]

AGENT_RENDERERS = ("anthropic", "gemini", "openai", "openai-responses")


def _args(step_args: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(step_args)
    return value


def _openai_chat(steps: tuple[LoopStep, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in steps:
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args}}
            for c in step.calls
        ]
        if step.text_apart and step.text:  # the text as a message of its own, then the calls
            out.append({"role": "assistant", "content": step.text})
            out.append({"role": "assistant", "content": None, "tool_calls": calls})
        else:
            out.append({"role": "assistant", "content": step.text or None, "tool_calls": calls})
        out.extend({"role": "tool", "tool_call_id": c.id, "content": c.content} for c in step.calls)
    return out


def _openai_responses(steps: tuple[LoopStep, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in steps:
        if step.text:
            out.append({"role": "assistant", "content": step.text})
        out.extend(
            {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.args}
            for c in step.calls
        )
        out.extend(
            {"type": "function_call_output", "call_id": c.id, "output": c.content}
            for c in step.calls
        )
    return out


def _anthropic(steps: tuple[LoopStep, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in steps:
        content: list[dict[str, Any]] = [{"type": "text", "text": step.text}] if step.text else []
        content.extend(
            {"type": "tool_use", "id": c.id, "name": c.name, "input": _args(c.args)}
            for c in step.calls
        )
        out.append({"role": "assistant", "content": content})
        results = [
            {"type": "tool_result", "tool_use_id": c.id, "content": c.content} for c in step.calls
        ]
        out.append({"role": "user", "content": results})
    return out


def _gemini(steps: tuple[LoopStep, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in steps:
        parts: list[dict[str, Any]] = [{"text": step.text}] if step.text else []
        parts.extend(
            {"functionCall": {"id": c.id, "name": c.name, "args": _args(c.args)}}
            for c in step.calls
        )
        out.append({"role": "model", "parts": parts})
        responses = [
            {"functionResponse": {"id": c.id, "name": c.name, "response": {"result": c.content}}}
            for c in step.calls
        ]
        out.append({"role": "user", "parts": responses})
    return out


_FORMATS = {
    "openai": ("messages", _openai_chat),
    "openai-responses": ("input", _openai_responses),
    "anthropic": ("messages", _anthropic),
    "gemini": ("contents", _gemini),
}


def loop_messages(loop: Loop, renderer: str) -> list[dict[str, Any]]:
    """The loop's messages (appended after the turn's user message) in one API's format."""
    if renderer not in _FORMATS:
        raise ConfigError(
            "renderer",
            f"no agent-loop format for {renderer!r} (known: {', '.join(AGENT_RENDERERS)})",
        )
    return _FORMATS[renderer][1](loop.steps)


def agent_request(
    agent: AgentTurn | Loop,
    renderer: str = "openai",
    model: str | None = None,
    *,
    counter: TokenCounter | None = None,
    max_tokens: int | None = None,
    conversation_id: str | None = None,
    profile: ModelProfile | None = None,
    ttl: Ttl | None = None,
) -> RenderedRequest:
    """The next request of an agent loop: the envelope's request (default layout, so the
    system + L2 prefix is the turn's own) with the fitted loop appended (``profile`` and
    ``ttl`` as ``render_request`` takes them)."""
    loop = agent.fit() if isinstance(agent, AgentTurn) else agent
    extra = loop_messages(loop, renderer)
    base = render_request(
        loop.envelope,
        renderer,
        model,
        counter=counter,
        max_tokens=max_tokens,
        conversation_id=conversation_id,
        profile=profile,
        ttl=ttl,
    )
    field = _FORMATS[renderer][0]
    body = dict(base.body)
    body[field] = [*body[field], *extra]
    if renderer == "anthropic":
        options = request_options(
            "anthropic", model, profile=profile, counter=counter, max_tokens=max_tokens, ttl=ttl
        )
        body = _mark_last_block(body, options, len(loop.steps))
    return RenderedRequest(base.provider, base.path, body)


def _blocks(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An Anthropic body's blocks in request order: the system's, then each message's."""
    system = body.get("system") or []
    return [*system, *(b for m in body["messages"] for b in m["content"])]


def _block_text(block: Mapping[str, Any]) -> str:
    if block.get("type") == "tool_use":
        return str(block["name"]) + json.dumps(block["input"], separators=(",", ":"))
    content = block.get("content", block.get("text", ""))
    return content if isinstance(content, str) else "".join(_block_text(c) for c in content)


def _mark_last_block(body: dict[str, Any], options: RequestOptions, steps: int) -> dict[str, Any]:
    """An agent loop's Anthropic request with a breakpoint on its last block, so the next
    step's request (this one plus a call and its result) reads all of it from the cache:
    the envelope's breakpoints stop at the turn's user message, and a loop's requests grow
    past it. Kept only when the request reaches the model's minimum. Past the provider's
    limit, a request with ``steps`` first gives up the turn's user message's (the loop's
    first call wrote that prefix, and the last block's 20-block look-back finds it), then
    the earliest (a later one's look-back covers them): L1's stable part stays marked while
    it can, for the request after a handoff."""
    rules = options.rules
    own = len(body["messages"]) - 2 * steps  # the envelope's messages come first
    body = json.loads(json.dumps(body))  # the blocks are marked in a copy
    blocks = _blocks(body)
    total = sum(options.counter.count(_block_text(b)) for b in blocks)
    if not blocks or "cache_control" in blocks[-1] or total < rules.min_tokens:
        return body
    cache: dict[str, str] = {"type": "ephemeral"}
    if options.ttl == "1h":
        cache["ttl"] = "1h"
    blocks[-1]["cache_control"] = cache
    turn = body["messages"][own - 1]["content"] if steps and own > 0 else []
    marked = [b for b in blocks if "cache_control" in b]
    first = [b for b in turn if "cache_control" in b]
    order = [*first, *(b for b in marked if all(b is not t for t in first))]
    for block in order[: max(0, len(marked) - rules.breakpoints)]:
        del block["cache_control"]
    return body


ANTHROPIC_TOOL_PROMPT = 346
"""The system prompt Anthropic adds to a request with tools, for its current models with
``tool_choice`` auto or none (``anthropic_tool_prompt`` has every model and choice)."""

# Anthropic's tool-use system prompt by model, from its tool-use pricing table:
# (tool_choice auto or none, tool_choice any or tool). The Claude 4 models (Opus 4 and
# 4.1, Sonnet 4 and 4.5, Haiku 4.5) and Sonnet 3.7 add 346 / 313; a model the table does
# not name (a newer one) is taken as those.
_ANTHROPIC_TOOL_PROMPTS: tuple[tuple[str, int, int], ...] = (
    ("claude-3-5-haiku", 264, 340),
    ("claude-3-opus", 530, 281),
    ("claude-3-sonnet", 159, 235),
    ("claude-3-haiku", 264, 340),
)
# Anthropic's choices, and OpenAI's names for them (LiteLLM takes OpenAI's and maps them).
_CHOICES = {"auto": 0, "none": 0, "any": 1, "tool": 1, "required": 1, "function": 1}


def anthropic_tool_prompt(model: str | None = None, tool_choice: Any = None) -> int:
    """Tokens of the system prompt Anthropic adds when a request carries tools.

    ``tool_choice`` as sent: None (the API's default, auto), ``"auto"``, ``"none"``,
    ``"any"``, ``"tool"`` or the API's ``{"type": ...}`` object (OpenAI's ``"required"``
    and ``{"type": "function"}``, which LiteLLM maps to any and tool, too); ``model`` any Claude
    name (a date suffix, a ``anthropic/`` route or a Bedrock ``anthropic.`` prefix is
    fine; None: the current models). A request without tools adds nothing."""
    choice = tool_choice.get("type") if isinstance(tool_choice, Mapping) else tool_choice
    column = _CHOICES.get("auto" if choice is None else choice)
    if column is None:
        raise ConfigError(
            "tool_choice",
            f"unknown tool_choice {tool_choice!r} (known: auto, none, any, tool, required)",
        )
    name = (model or "").lower()
    for prefix, auto, forced in _ANTHROPIC_TOOL_PROMPTS:
        if prefix in name:
            return (auto, forced)[column]
    return (ANTHROPIC_TOOL_PROMPT, 313)[column]


# OpenAI's own counting of function definitions (the cookbook "How to count tokens with
# tiktoken", gpt-4o / gpt-4o-mini constants): per function, per parameter, enums, end.
_FUNC_INIT, _PROP_INIT, _PROP_KEY, _ENUM_INIT, _ENUM_ITEM, _FUNC_END = 7, 3, 3, -3, 3, 12


def _openai_tool_tokens(tools: Sequence[Mapping[str, Any]], counter: TokenCounter) -> int:
    total = 0
    for tool in tools:
        total += _FUNC_INIT
        description = str(tool.get("description") or "").removesuffix(".")
        total += counter.count(f"{tool['name']}:{description}")
        properties = dict((tool.get("parameters") or {}).get("properties") or {})
        if properties:
            total += _PROP_INIT
        for key, spec in properties.items():
            total += _PROP_KEY
            enum = spec.get("enum") or ()
            if enum:
                total += _ENUM_INIT + sum(_ENUM_ITEM + counter.count(str(e)) for e in enum)
            kind = spec.get("type", "")
            text = str(spec.get("description") or "").removesuffix(".")
            total += counter.count(f"{key}:{kind}:{text}")
    return total + _FUNC_END if tools else 0


def instructions_tokens(
    instructions: Sequence[str], counter: TokenCounter | None = None, per_message: int = 3
) -> int:
    """Tokens a framework's own instructions add to a request, each text a system message
    of its own beside Lamina's (pydantic-ai's ``Agent(instructions=...)`` and
    ``@agent.instructions`` functions, as its OpenAI chat model sends them): per text its
    message framing (``per_message``) and its count. The adapter counts them in the budget
    with this; ``usage_record(instructions=)`` in the predicted input."""
    counter = counter or TokenCounter("o200k_base")
    return sum(per_message + counter.count(text) for text in instructions)


def tool_tokens(
    tools: Sequence[Mapping[str, Any]],
    provider: str,
    counter: TokenCounter | None = None,
    *,
    tool_choice: Any = None,
    model: str | None = None,
) -> int:
    """Tokens the tool definitions add to every request of a loop (``name``,
    ``description``, ``parameters`` as a JSON schema, as each framework holds them).

    OpenAI (chat and Responses): OpenAI's published counting of function definitions.
    Anthropic: the tool-use system prompt it adds (``anthropic_tool_prompt``: by
    ``model`` and ``tool_choice``) and the definitions as sent (JSON). Gemini and others:
    the definitions as sent (JSON). ``AgentTurn.start(tools_tokens=)`` counts them in the
    budget; ``usage_record(tools=)`` in the predicted input.
    """
    counter = counter or TokenCounter("o200k_base")
    if not tools:
        return 0
    if provider in ("openai", "openai-responses"):
        return _openai_tool_tokens(tools, counter)
    sent = [
        {
            "name": t["name"],
            "description": t.get("description") or "",
            "input_schema": t.get("parameters") or {},
        }
        for t in tools
    ]
    text = json.dumps(sent, ensure_ascii=False, separators=(",", ":"))
    prompt = anthropic_tool_prompt(model, tool_choice) if provider == "anthropic" else 0
    return prompt + counter.count(text)
