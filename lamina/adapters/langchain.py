"""LangChain: an envelope as ``BaseMessage``s, and an agent middleware that builds each
model call with Lamina.

``to_messages`` gives ``[SystemMessage(L1 + L2), history, HumanMessage(L3 + L5)]`` and
the turn's tool calls and results; for Anthropic every message is the content blocks of
Lamina's own Anthropic body, with each ``cache_control`` breakpoint it sets. ``LaminaMiddleware``
replaces the system message and messages of every model call of a ``create_agent`` run
with Lamina's, the turn's tool calls fitted to the budget as call + result units; the
request's tool definitions are counted and ``create_agent(system_prompt=...)`` goes into
L1's mutable part::

    from langchain.agents import create_agent
    from lamina.adapters.langchain import LaminaMiddleware

    lamina = LaminaMiddleware(conversation)
    agent = create_agent(model, tools=[search], middleware=[lamina])
    lamina.attach({"note": "project-spec.md"})
    state = agent.invoke({"messages": [{"role": "user", "content": "What changed?"}]})
    lamina.finish(state["messages"][-1].text)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.utils.function_calling import convert_to_openai_tool

from lamina.adapters._loop import Call, LoopAdapter, LoopState
from lamina.pipeline import Conversation, Envelope
from lamina.pipeline.agent import Loop
from lamina.pipeline.errors import ConversationError
from lamina.renderers import agent_request, render_request, tool_tokens

__all__ = ["LaminaMiddleware", "to_messages"]


def _anthropic_messages(source: Envelope | Loop, model: str | None) -> list[AnyMessage]:
    """Lamina's own Anthropic body as content blocks, so every ``cache_control``
    breakpoint it sets (system, history, turn, an agent loop's last block) is carried;
    a loop's ``tool_use`` blocks are the AIMessage's tool calls too."""
    if isinstance(source, Loop):
        body = agent_request(source, "anthropic", model).body
    else:
        body = render_request(source, "anthropic", model).body
    out: list[AnyMessage] = []
    if body.get("system"):
        out.append(SystemMessage(content=body["system"]))
    for m in body["messages"]:
        if m["role"] == "assistant":
            calls = [
                {"name": b["name"], "args": b["input"], "id": b["id"]}
                for b in m["content"]
                if b["type"] == "tool_use"
            ]
            out.append(AIMessage(content=m["content"], tool_calls=calls))
        else:
            out.append(HumanMessage(content=m["content"]))
    return out


def _envelope_messages(envelope: Envelope) -> list[AnyMessage]:
    """The envelope's messages as sent: system, history, then this turn's user text."""
    out: list[AnyMessage] = []
    envelope = envelope.as_sent()
    if envelope.system_text:
        out.append(SystemMessage(content=envelope.system_text))
    for role, text in envelope.history():
        out.append(AIMessage(content=text) if role == "assistant" else HumanMessage(content=text))
    out.append(HumanMessage(content=envelope.user_text))
    return out


def to_messages(
    source: Envelope | Loop, provider: str = "openai", model: str | None = None
) -> list[AnyMessage]:
    """Lamina's request as LangChain messages (``provider`` decides the content shape)."""
    if provider == "anthropic":
        return _anthropic_messages(source, model)
    loop = source if isinstance(source, Loop) else None
    envelope = source.envelope if isinstance(source, Loop) else source
    out = _envelope_messages(envelope)
    for step in loop.steps if loop is not None else ():
        calls = [{"name": c.name, "args": json.loads(c.args), "id": c.id} for c in step.calls]
        out.append(AIMessage(content=step.text, tool_calls=calls))
        out.extend(ToolMessage(content=c.content, tool_call_id=c.id) for c in step.calls)
    return out


def _text(message: BaseMessage) -> str:
    return message.content if isinstance(message.content, str) else message.text


def _sent(call: ToolCall, provider: str) -> str:
    return "" if provider == "anthropic" else json.dumps(call["args"], ensure_ascii=False)


def _steps(messages: Sequence[AnyMessage], provider: str) -> list[tuple[str, list[Call]]]:
    """(text, calls) per AIMessage with calls; the arguments' text as LangChain sends them
    in OpenAI's format (``json.dumps`` with its default spaces: ``{"q": "x"}``, a token
    or two more than compact JSON); Anthropic's are ``tool_use`` input objects."""
    results = {m.tool_call_id: _text(m) for m in messages if isinstance(m, ToolMessage)}
    steps: list[tuple[str, list[Call]]] = []
    for m in messages:
        if isinstance(m, AIMessage) and m.tool_calls:
            calls = [
                Call(str(c["id"]), c["name"], c["args"], results[str(c["id"])], _sent(c, provider))
                for c in m.tool_calls
                if str(c["id"]) in results
            ]
            if calls:
                steps.append((_text(m), calls))
    return steps


class LaminaMiddleware(LoopAdapter, AgentMiddleware):
    """Builds every model call of a LangChain agent from a Lamina conversation."""

    def __init__(
        self,
        conversation: Conversation,
        provider: str = "openai",
        model: str | None = None,
        tool_headroom: int | None = None,
    ) -> None:
        super().__init__()
        self.state = LoopState(conversation, tool_headroom)
        self.provider = provider
        self.model = model

    def build(
        self,
        messages: Sequence[AnyMessage],
        tools: Sequence[Any] = (),
        system: str | None = None,
    ) -> list[AnyMessage]:
        """The messages Lamina sends for an agent state's messages; ``tools`` (the
        request's tool definitions) are counted, ``system`` (``create_agent``'s
        ``system_prompt``) goes into L1's mutable part."""
        start = max(
            (i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=None
        )
        if start is None:
            raise ConversationError("the agent's messages hold no user message")
        defs = [convert_to_openai_tool(t)["function"] for t in tools]
        added = tool_tokens(defs, self.provider, self.conversation.counter)
        loop = self.state.fit_query(
            _text(messages[start]),
            _steps(messages[start + 1 :], self.provider),
            tools_tokens=added,
            system=system,
            tools=defs,
        )
        return to_messages(loop, self.provider, self.model)

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> ModelResponse:
        prompt = request.system_message
        built = self.build(request.messages, request.tools, _text(prompt) if prompt else None)
        system = built[0] if built and isinstance(built[0], SystemMessage) else None
        rest = built[1:] if system is not None else built
        return handler(request.override(system_message=system, messages=rest))
