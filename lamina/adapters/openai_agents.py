"""OpenAI Agents SDK: a ``call_model_input_filter`` and a ``Session`` on Lamina's store.

The filter replaces each model call's instructions with L1 + L2 (the agent's own
instructions in L1's mutable part) and its input with the history, this turn's user
message (L3 + L5) and the turn's tool calls and outputs, fitted to the budget as call +
output units (the Responses API shape Lamina renders), the tool and handoff definitions
counted. After a handoff within a turn to an agent with other instructions, the next
model calls carry the new agent's instructions the way the SDK sends them: in L1's mutable
part, after the same stable part (which stays cached), counted and fitted like the first
agent's with the new agent's tool and handoff definitions, and a ``handoff`` decision (L1)
in the report of those calls' envelope (``session.loops[i].envelope``), so the trace,
``explain_cache`` and the cache report say why the prefix broke there. The turn's own
envelope (saved with the turn) and the conversation keep the instructions the run started
with: the next turn's L1 mutable part is the instructions of the agent the next run starts
with (the filter adopts them again), so a triage agent's prefix is the one every turn
starts from, and a conversation loaded from the store continues byte for byte.
The session serves the conversation's history and, when the run ends, records the
final answer as the turn's reply and saves the turn to the store. The SDK saves a run's
items after every model response; text the model sends together with a tool call ("Let
me search...") is interim, part of the loop's step (sent, counted and cut with its call),
and only a response without a call ends the turn. A run whose final output is not an
assistant message (``tool_use_behavior`` that stops at a tool) ends with
``session.finish(result.final_output)``::

    from agents import RunConfig, Runner
    from lamina.adapters.openai_agents import LaminaSession

    session = LaminaSession(conversation, store, "conv-42")
    config = RunConfig(call_model_input_filter=session.call_model_input_filter)
    session.attach({"note": "project-spec.md"})
    result = await Runner.run(agent, "What changed?", session=session, run_config=config)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents import Agent, FunctionTool
from agents.handoffs import Handoff, handoff
from agents.items import TResponseInputItem
from agents.memory import SessionABC
from agents.models._openai_shared import get_use_responses_by_default
from agents.models.interface import Model
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.run import CallModelData, ModelInputData

from lamina.adapters._loop import Call, LoopAdapter, LoopState
from lamina.pipeline import Conversation
from lamina.pipeline.errors import ConversationError, UnknownConversation
from lamina.pipeline.store import ConversationInfo, Store, save_turn
from lamina.renderers import agent_request, tool_tokens

__all__ = ["LaminaSession", "final_answer"]


def _plain(item: Any) -> Mapping[str, Any]:
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    return dump(exclude_unset=True) if callable(dump) else {}


def _text(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(p.get("text", "")) for p in map(_plain, content) if "text" in p
        )
    return ""


def _steps(items: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Call]]]:
    outputs = {
        str(i["call_id"]): str(i.get("output", ""))
        for i in items
        if i.get("type") == "function_call_output"
    }
    steps: list[tuple[str, list[Call]]] = []
    calls: list[Call] = []
    text, answered = "", False
    for item in items:
        kind = item.get("type")
        if kind == "function_call" and str(item["call_id"]) in outputs:
            if answered:  # a call after outputs is the model's next step
                steps.append((text, calls))
                text, calls, answered = "", [], False
            call_id = str(item["call_id"])
            calls.append(Call(call_id, str(item["name"]), item["arguments"], outputs[call_id]))
        elif kind == "function_call_output":
            answered = bool(calls)
        elif item.get("role") == "assistant":
            if calls:
                steps.append((text, calls))
                calls, answered = [], False
            text = _text(item)
    if calls:
        steps.append((text, calls))
    return steps


_INTERIM = (None, "message", "reasoning")
"""Item types that do not continue the loop (``None``: an easy input message)."""


def final_answer(items: Sequence[Mapping[str, Any]]) -> str | None:
    """The run's final output among items the SDK saves: the last assistant message when
    no call or call output follows it, else None (a message followed by a call is the
    model's interim text, part of that step)."""
    last = max((i for i, it in enumerate(items) if it.get("role") == "assistant"), default=None)
    if last is None or any(it.get("type") not in _INTERIM for it in items[last + 1 :]):
        return None
    return _text(items[last])


def _tool_definitions(agent: Agent[Any]) -> list[dict[str, Any]]:
    """The agent's function tools and handoffs as (name, description, parameters)."""
    defs = [
        {"name": t.name, "description": t.description, "parameters": t.params_json_schema}
        for t in agent.tools
        if isinstance(t, FunctionTool)
    ]
    for target in agent.handoffs:
        made = target if isinstance(target, Handoff) else handoff(target)
        defs.append(
            {
                "name": made.tool_name,
                "description": made.tool_description,
                "parameters": made.input_json_schema,
            }
        )
    return defs


def _over_chat_completions(agent: Agent[Any]) -> bool:
    """Whether the agent's model speaks Chat Completions: an ``OpenAIChatCompletionsModel``,
    or a model name under the SDK's default API (``set_default_openai_api``)."""
    if isinstance(agent.model, Model):
        return isinstance(agent.model, OpenAIChatCompletionsModel)
    return not get_use_responses_by_default()


class LaminaSession(LoopAdapter, SessionABC):
    """Conversation history for the Agents SDK, backed by a Lamina conversation and store.

    ``chat_completions`` says whether the model is called over Chat Completions, where the
    SDK sends a step's interim text ("Let me search...") and its calls as two assistant
    messages (counted so: ``LoopStep.text_apart``); None reads it from each agent's model
    (an ``OpenAIChatCompletionsModel``, or a name under the SDK's default API). Pass it
    when the model is set elsewhere (``RunConfig(model=...)``, another ``Model`` class).
    """

    def __init__(
        self,
        conversation: Conversation,
        store: Store | None = None,
        conversation_id: str = "",
        tool_headroom: int | None = None,
        chat_completions: bool | None = None,
    ) -> None:
        self.state = LoopState(conversation, tool_headroom)
        self.store = store
        self.session_id = conversation_id
        self.chat_completions = chat_completions

    def call_model_input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """``RunConfig(call_model_input_filter=...)``: Lamina's instructions and input.
        The agent's own instructions go into L1's mutable part (a handoff within the turn:
        the new agent's, from that call on); its tool and handoff definitions are counted
        (OpenAI's counting)."""
        items = [_plain(i) for i in data.model_data.input]
        start = max((i for i, it in enumerate(items) if it.get("role") == "user"), default=None)
        if start is None:
            raise ConversationError(
                "the model input holds no user message (RunConfig(nest_handoff_history=True) "
                "folds it into a summary at a handoff: Lamina builds each call's input "
                "itself, so leave it False, the default)"
            )
        defs = _tool_definitions(data.agent)
        added = tool_tokens(defs, "openai-responses", self.conversation.counter)
        chat = self.chat_completions
        self.state.text_apart = _over_chat_completions(data.agent) if chat is None else chat
        loop = self.state.fit_query(
            _text(items[start]),
            _steps(items[start + 1 :]),
            tools_tokens=added,
            tools=defs,
            system=data.model_data.instructions or "",
        )
        body = agent_request(loop, "openai-responses").body
        return ModelInputData(input=body["input"], instructions=body.get("instructions"))

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation's history as input items (a turn in progress is not history)."""
        history = self.conversation.history
        if self.state.in_progress:
            history = history[:-1]
        items: list[TResponseInputItem] = []
        for entry in history:
            items.append({"role": "user", "content": entry.user})
            if entry.assistant is not None:
                items.append({"role": "assistant", "content": entry.assistant})
        return items if limit is None else items[-limit:] if limit else []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """The run's new items: its final assistant text (``final_answer``) becomes the
        turn's reply; interim text with a call, inputs and call outputs change nothing."""
        answer = final_answer([_plain(i) for i in items])
        if answer is not None and self.state.in_progress:
            self.finish(answer)

    def finish(self, answer: str) -> None:
        """End the turn with ``answer`` and save it to the store (when one was given)."""
        self.state.finish(answer)
        if self.store is not None and self.session_id:
            try:
                self.store.conversation(self.session_id)
            except UnknownConversation:
                self.store.create(ConversationInfo(self.session_id))
            assert self.state.envelope is not None
            save_turn(
                self.store, self.session_id, self.conversation, self.state.envelope,
                self.state.attached,
            )  # fmt: skip

    async def pop_item(self) -> TResponseInputItem | None:
        raise ConversationError("a Lamina session keeps its turns: pop_item is not supported")

    async def clear_session(self) -> None:
        raise ConversationError("a Lamina session keeps its turns: clear it in the store")
