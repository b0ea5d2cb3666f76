"""pydantic-ai: a history processor that hands the model Lamina's envelope.

Each model request of a run gets ``[system: L1 + L2] -> L4 history -> [user: L3 + L5]``
followed by the turn's tool calls and returns, fitted to the budget as one unit each
(a result may be cut or stubbed, never separated from its call). Lamina keeps the
history, so do not pass ``message_history`` to the run::

    from pydantic_ai import Agent
    from lamina.adapters.pydantic_ai import LaminaHistory

    history = LaminaHistory(conversation)
    agent = Agent(model, capabilities=[history.capability()], tools=[search])
    history.attach({"note": "project-spec.md"})
    result = agent.run_sync("What changed in the spec?")
    history.finish(result.output)

(pydantic-ai 2 replaced ``Agent(history_processors=[...])`` with the ``ProcessHistory``
capability; ``history.capability()`` is one that also sees each request's instruction
parts, and ``ProcessHistory(history)`` works too.) What pydantic-ai adds to each request is
counted in the budget: the tool definitions (``lamina.renderers.tool_tokens`` for ``provider``)
and its instructions (``Agent(instructions=...)``, ``@agent.instructions`` functions),
which it sends as system messages of their own (``lamina.renderers.instructions_tokens``; pass
``history.instructions[n]`` to ``usage_record(instructions=)``);
``Agent(system_prompt=...)`` goes into L1's mutable part. The turn leaves
``tool_headroom`` tokens free for the first calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    CachePoint,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from lamina.adapters._loop import Call, LoopAdapter, LoopState
from lamina.pipeline import Conversation, Envelope
from lamina.pipeline.agent import Loop
from lamina.renderers import instructions_tokens, tool_tokens

if TYPE_CHECKING:
    from pydantic_ai.models import ModelRequestContext

__all__ = ["LaminaHistory", "LaminaProcessHistory", "envelope_messages"]


def _user_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    return "\n\n".join(c for c in part.content if isinstance(c, str))


def _is_prompt(part: object) -> bool:
    """A user prompt with text: not the bare ``CachePoint`` that marks a loop's last tool
    result (``_loop_messages``), which pydantic-ai hands back with the history."""
    return isinstance(part, UserPromptPart) and (
        isinstance(part.content, str) or any(isinstance(c, str) for c in part.content)
    )


def envelope_messages(envelope: Envelope, *, cache_points: bool = False) -> list[ModelMessage]:
    """The envelope as pydantic-ai messages: system, history, then this turn's user text.

    ``cache_points`` (Anthropic): a ``CachePoint`` where Lamina's own Anthropic request
    puts a breakpoint in the messages: the end of the history (a ``CachePoint`` before
    the user text marks the message before it, an assistant reply too) and, when the
    request defers context (``Envelope.batch``), the end of the turn. The system
    message's end is marked by pydantic-ai's ``anthropic_cache_instructions``: pydantic-ai
    sends the system text as one block, which no ``CachePoint`` reaches."""
    out: list[ModelMessage] = []
    batched = envelope.batch is not None
    envelope = envelope.as_sent()
    history = envelope.history()
    if envelope.system_text:
        out.append(ModelRequest(parts=[SystemPromptPart(envelope.system_text)]))
    for role, text in history:
        if role == "assistant":
            out.append(ModelResponse(parts=[TextPart(text)]))
        else:
            out.append(ModelRequest(parts=[UserPromptPart(text)]))
    if not cache_points:
        out.append(ModelRequest(parts=[UserPromptPart(envelope.user_text)]))
        return out
    after = [CachePoint()] if history else []
    turn = [CachePoint()] if batched else []
    out.append(ModelRequest(parts=[UserPromptPart([*after, envelope.user_text, *turn])]))
    return out


def _marked(message: ModelMessage) -> ModelMessage:
    """The request's last message with a breakpoint on its last block, as Lamina's own
    loop request has (the last tool result, or the turn's user message on the first
    call), so the next call reads this whole request: a ``CachePoint`` alone after the
    message's parts marks the block before it."""
    assert isinstance(message, ModelRequest)
    last = message.parts[-1]
    content = last.content if isinstance(last, UserPromptPart) else None
    if isinstance(content, list) and content and isinstance(content[-1], CachePoint):
        return message
    return ModelRequest(parts=[*message.parts, UserPromptPart([CachePoint()])])


def _loop_messages(loop: Loop) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for step in loop.steps:
        parts: list[ModelResponsePart] = [TextPart(step.text)] if step.text else []
        parts.extend(ToolCallPart(c.name, c.args, c.id) for c in step.calls)
        out.append(ModelResponse(parts=parts))
        returns: list[ModelRequestPart] = [
            ToolReturnPart(c.name, c.content, c.id) for c in step.calls
        ]
        out.append(ModelRequest(parts=returns))
    return out


def _steps(messages: Sequence[ModelMessage]) -> list[tuple[str, list[Call]]]:
    """(text, calls) per model response after the query, each call with its result."""
    results: dict[str, str] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    results[part.tool_call_id] = part.model_response_str()
                elif isinstance(part, RetryPromptPart) and part.tool_call_id:
                    results[part.tool_call_id] = part.model_response()
    steps: list[tuple[str, list[Call]]] = []
    for message in messages:
        if not isinstance(message, ModelResponse):
            continue
        calls = [
            Call(p.tool_call_id, p.tool_name, p.args_as_dict(), results[p.tool_call_id])
            for p in message.parts
            if isinstance(p, ToolCallPart) and p.tool_call_id in results
        ]
        if calls:
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            steps.append((text, calls))
    return steps


@dataclass
class LaminaProcessHistory(ProcessHistory[Any]):
    """``ProcessHistory`` for a ``LaminaHistory`` (``history.capability()``) that also hands
    it the request's instruction parts, which a history processor alone sees joined: a
    static ``Agent(instructions=...)`` and each ``@agent.instructions`` function go out as
    system messages of their own (pydantic-ai's OpenAI chat model), each framed."""

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if isinstance(self.processor, LaminaHistory):
            parts = request_context.model_request_parameters.instruction_parts
            self.processor.instruction_parts = (
                None if parts is None else tuple(p.content for p in parts)
            )
        return await super().before_model_request(ctx, request_context)


class LaminaHistory(LoopAdapter):
    """A pydantic-ai history processor backed by a Lamina conversation."""

    def __init__(
        self,
        conversation: Conversation,
        provider: str = "openai",
        tool_headroom: int | None = None,
    ) -> None:
        self.state = LoopState(conversation, tool_headroom)
        self.provider = provider
        self.instruction_parts: tuple[str, ...] | None = None
        """The next request's instruction parts, when ``LaminaProcessHistory`` runs this."""
        self.instructions: list[tuple[str, ...]] = []
        """What pydantic-ai sent as instructions beside each request of ``loops``, in order
        (its ``Agent(instructions=...)`` and ``@agent.instructions`` functions' text, as
        the request it sent records it): ``usage_record(loops[: n + 1], ...,
        instructions=history.instructions[n])`` predicts the n-th request as billed."""

    def capability(self) -> LaminaProcessHistory:
        """The capability to give the agent (``Agent(capabilities=[history.capability()])``):
        ``ProcessHistory(self)`` that also sees each request's instruction parts, so a
        static string and ``@agent.instructions`` functions are counted as sent."""
        return LaminaProcessHistory(self)

    def _sent_instructions(self, joined: str | None) -> tuple[str, ...]:
        """The instruction texts the request sends, each a message of its own: the parts
        (``LaminaProcessHistory``) for OpenAI chat, else joined as pydantic-ai joins them;
        without the parts, the request's joined ``instructions``."""
        parts, self.instruction_parts = self.instruction_parts, None
        if parts is None:
            return (joined,) if joined else ()
        if self.provider == "openai":
            return parts
        text = "\n\n".join(parts).strip()
        return (text,) if text else ()

    @staticmethod
    def _tools(ctx: RunContext[Any] | None) -> list[dict[str, Any]]:
        """The request's tool definitions as (name, description, parameters)."""
        defs = ctx.tool_manager.tool_defs if ctx is not None and ctx.tool_manager else []
        return [
            {"name": d.name, "description": d.description, "parameters": d.parameters_json_schema}
            for d in defs
        ]

    def _added(self, ctx: RunContext[Any] | None, instructions: Sequence[str]) -> int:
        """Tokens pydantic-ai adds to the request: tool definitions and its instructions
        (``lamina.renderers.instructions_tokens``, as ``usage_record`` predicts them)."""
        counter = self.conversation.counter
        budget = self.conversation.budget
        per_message = budget.framing.per_message if budget is not None else 3
        return tool_tokens(self._tools(ctx), self.provider, counter) + instructions_tokens(
            instructions, counter, per_message
        )

    def __call__(self, ctx: RunContext[Any], messages: list[ModelMessage]) -> list[ModelMessage]:
        requests = [m for m in messages if isinstance(m, ModelRequest)]
        instructions = self._sent_instructions(requests[-1].instructions if requests else None)
        start = max(
            (
                i
                for i, m in enumerate(messages)
                if isinstance(m, ModelRequest) and any(_is_prompt(p) for p in m.parts)
            ),
            default=None,
        )
        if start is None:
            return messages
        prompt = next(p for p in messages[start].parts if _is_prompt(p))
        assert isinstance(prompt, UserPromptPart)
        # Lamina's own system message as it sent it (as_sent: what envelope_messages gave).
        own = {loop.envelope.as_sent().system_text for loop in self.state.loops[-1:]}
        system = "\n\n".join(
            p.content
            for m in messages[: start + 1]
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, SystemPromptPart) and p.content not in own
        )
        loop = self.state.fit_query(
            _user_text(prompt),
            _steps(messages[start + 1 :]),
            tools_tokens=self._added(ctx, instructions),
            system=system or None,
            tools=self._tools(ctx),
        )
        self.instructions.append(instructions)
        self.state.instructions_sent(instructions)
        marks = self.provider == "anthropic"
        out = [*envelope_messages(loop.envelope, cache_points=marks), *_loop_messages(loop)]
        if marks:  # a loop's request: its last block too, as Lamina's own Anthropic request
            out[-1] = _marked(out[-1])
        return out
