"""LiteLLM: ``completion(messages=...)`` with Lamina's request, cache breakpoints kept.

For an Anthropic model the messages carry Lamina's ``cache_control`` blocks (the system
as one block per L1 part and L2 entry, breakpoints where ``anthropic_breakpoints`` puts
them), which LiteLLM passes through to the Messages API unchanged. Do not also set
LiteLLM's ``cache_control_injection_points``: it adds breakpoints of its own (by role or
message index), which can exceed Anthropic's four or mark a block whose prefix changes
every turn. Other providers get plain OpenAI-format messages (their caching is automatic)::

    from lamina.adapters.litellm import completion
    response = completion([envelope], "anthropic/claude-sonnet-4-6")
    conversation.reply(response.choices[0].message.content)

A tool loop passes the ``AgentTurn`` (or its fitted ``Loop``) instead of the envelope:
the turn's request comes first, then its steps as OpenAI-format assistant ``tool_calls``
and ``tool`` messages, which LiteLLM turns into each provider's own tool blocks::

    agent = AgentTurn.start(conversation, query, attachments)
    while (message := completion(agent, model, tools=TOOLS).choices[0].message).tool_calls:
        agent = agent.step(*(agent_call(c.function.name, json.loads(c.function.arguments),
                                        run(c), id=c.id) for c in message.tool_calls))
    agent.finish(conversation, message.content)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import litellm

from lamina.pipeline import Envelope
from lamina.pipeline.agent import AgentTurn, Loop
from lamina.renderers import agent_request, loop_messages, render_request, tool_tokens

__all__ = ["completion", "split_model", "to_messages", "with_tools"]

_PROVIDERS = {"anthropic": "anthropic", "openai": "openai", "gemini": "gemini"}


def split_model(model: str) -> tuple[str, str]:
    """LiteLLM's ``provider/model`` name as (Lamina provider, model)."""
    name, provider, _, _ = litellm.get_llm_provider(model)
    return _PROVIDERS.get(provider, "openai"), name


Request = Envelope | Sequence[Envelope] | AgentTurn | Loop


def to_messages(request: Request, model: str) -> list[dict[str, Any]]:
    """Lamina's request for the last envelope (or the agent loop's next request) as
    LiteLLM (OpenAI-format) messages. For Anthropic, a loop's request carries the
    breakpoint Lamina puts on its last block (``agent_request``) as the last tool
    message's ``cache_control``, which LiteLLM sets on that ``tool_result`` block."""
    if not isinstance(request, AgentTurn | Loop):
        envs = [request] if isinstance(request, Envelope) else list(request)
        provider, name = split_model(model)
        if provider != "anthropic":
            messages: list[dict[str, Any]] = render_request(envs, "openai").body["messages"]
            return messages
        return _anthropic_messages(render_request(envs, "anthropic", name).body)
    loop = request.fit() if isinstance(request, AgentTurn) else request
    steps = loop_messages(loop, "openai")
    provider, name = split_model(model)
    if provider != "anthropic":
        return [*to_messages(loop.envelope, model), *steps]
    body = agent_request(loop, "anthropic", name).body
    own = len(body["messages"]) - 2 * len(loop.steps)  # the envelope's messages
    marks = {
        block["tool_use_id"]: block["cache_control"]
        for message in body["messages"][own:]
        for block in message["content"]
        if block["type"] == "tool_result" and "cache_control" in block
    }
    for message in steps:
        if message["role"] == "tool" and message["tool_call_id"] in marks:
            message["cache_control"] = marks[message["tool_call_id"]]
    return [*_anthropic_messages({**body, "messages": body["messages"][:own]}), *steps]


def _anthropic_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """An Anthropic body's system and messages as OpenAI-format messages of its blocks."""
    system = [{"role": "system", "content": body["system"]}] if "system" in body else []
    return [*system, *({"role": m["role"], "content": m["content"]} for m in body["messages"])]


def with_tools(request: Request, model: str, **kwargs: Any) -> Request:
    """``request`` with the ``tools`` of a ``completion`` call's ``kwargs`` counted into an
    ``AgentTurn``'s ``tools_tokens`` (each provider's rule, ``lamina.renderers.tool_tokens``, with
    the call's ``tool_choice`` and model: Anthropic's tool prompt depends on both)."""
    tools = kwargs.get("tools") or ()
    if not isinstance(request, AgentTurn) or not tools:
        return request
    defs = [t.get("function", t) for t in tools]
    provider, name = split_model(model)
    added = tool_tokens(
        defs, provider, request.counter, tool_choice=kwargs.get("tool_choice"), model=name
    )
    return attrs.evolve(request, tools_tokens=added)


def completion(request: Request, model: str, **kwargs: Any) -> Any:
    """``litellm.completion`` with Lamina's messages (``kwargs`` pass through). An
    ``AgentTurn`` is fitted with the ``tools`` definitions counted (``with_tools``); pass
    ``tools_tokens=`` to ``AgentTurn.start`` as well so the turn leaves room for them."""
    request = with_tools(request, model, **kwargs)
    return litellm.completion(model=model, messages=to_messages(request, model), **kwargs)
