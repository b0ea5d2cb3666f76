"""OpenAI Agents SDK: a ``call_model_input_filter`` and a ``Session`` on Lamina's store.

The filter replaces each model call's instructions with L1 + L2 and its input with the
history, this turn's user message (L3 + L5) and the turn's tool calls and outputs,
fitted to the budget as call + output units (the Responses API shape Lamina renders).
The session serves the conversation's history and, when the run ends, records the
final answer as the turn's reply and saves the turn to the store::

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

from agents.items import TResponseInputItem
from agents.memory import SessionABC
from agents.run import CallModelData, ModelInputData

from lamina.adapters._loop import Call, LoopAdapter, LoopState
from pipeline import (
    Conversation,
    ConversationError,
    ConversationInfo,
    Store,
    UnknownConversation,
    save_turn,
)
from renderers import agent_request

__all__ = ["LaminaSession"]


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


class LaminaSession(LoopAdapter, SessionABC):
    """Conversation history for the Agents SDK, backed by a Lamina conversation and store."""

    def __init__(
        self,
        conversation: Conversation,
        store: Store | None = None,
        conversation_id: str = "",
    ) -> None:
        self.state = LoopState(conversation)
        self.store = store
        self.session_id = conversation_id

    def call_model_input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """``RunConfig(call_model_input_filter=...)``: Lamina's instructions and input."""
        items = [_plain(i) for i in data.model_data.input]
        start = max((i for i, it in enumerate(items) if it.get("role") == "user"), default=None)
        if start is None:
            raise ConversationError("the model input holds no user message")
        loop = self.state.fit_query(_text(items[start]), _steps(items[start + 1 :]))
        body = agent_request(loop, "openai-responses").body
        return ModelInputData(input=body["input"], instructions=body.get("instructions"))

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        items: list[TResponseInputItem] = []
        for entry in self.conversation.history:
            items.append({"role": "user", "content": entry.user})
            if entry.assistant is not None:
                items.append({"role": "assistant", "content": entry.assistant})
        return items if limit is None else items[-limit:] if limit else []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """The run's new items: its final assistant text becomes the turn's reply."""
        answers = [_text(p) for p in map(_plain, items) if p.get("role") == "assistant"]
        if not answers or self.state.envelope is None or not self.state.is_current(
            self.state.query or ""
        ):
            return
        self.state.finish(answers[-1])
        if self.store is not None and self.session_id:
            try:
                self.store.conversation(self.session_id)
            except UnknownConversation:
                self.store.create(ConversationInfo(self.session_id))
            save_turn(self.store, self.session_id, self.conversation, self.state.envelope)

    async def pop_item(self) -> TResponseInputItem | None:
        raise ConversationError("a Lamina session keeps its turns: pop_item is not supported")

    async def clear_session(self) -> None:
        raise ConversationError("a Lamina session keeps its turns: clear it in the store")
