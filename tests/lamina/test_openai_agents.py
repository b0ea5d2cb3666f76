"""OpenAI Agents SDK: the input filter and session with a fake Model (offline)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from lamina import Conversation, load_conversation
from lamina.adapters.openai_agents import LaminaSession
from pipeline import Budget, ConversationInfo, SqliteStore
from renderers import agent_request

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"


class Scripted(Model):
    """Searches twice per question, then answers; records what each call received."""

    def __init__(self) -> None:
        self.received: list[tuple[str | None, list[Any]]] = []

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [dict(i) for i in input] if isinstance(input, list) else input
        self.received.append((system_instructions, items))
        n = len(self.received)
        calls = sum(1 for i in items if i.get("type") == "function_call")
        if calls < 2:
            output: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call",
                    call_id=f"call-{n}",
                    name="search",
                    arguments=json.dumps({"q": f"r{n}"}),
                )
            ]
        else:
            output = [
                ResponseOutputMessage(
                    id=f"msg-{n}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[
                        ResponseOutputText(
                            type="output_text", text=f"Answer {n}.", annotations=[]
                        )
                    ],
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@function_tool
def search(q: str) -> str:
    """Search the project notes."""
    return f"Results for {q}: " + " ".join(f"finding-{i} on sync" for i in range(150))


def test_ten_turns_through_filter_and_session(tmp_path: Path) -> None:
    budget = Budget(context_window=2400, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    store = SqliteStore(tmp_path / "s.db")
    session = LaminaSession(conv, store, "conv-1")
    model = Scripted()
    agent = Agent(name="notes", model=model, tools=[search])
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )

    async def run() -> None:
        for i in range(10):
            if i % 3 == 0:
                session.attach({"note": "project-spec.md"})
            await Runner.run(agent, f"Question {i}?", session=session, run_config=config)

    asyncio.run(run())
    assert len(model.received) == len(session.loops) == 30
    stubbed = 0
    for (instructions, items), loop in zip(model.received, session.loops, strict=True):
        body = agent_request(loop, "openai-responses").body
        assert instructions == body["instructions"]
        assert items == body["input"]
        calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
        outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
        assert calls == outputs
        assert budget.effective(loop.tokens) <= budget.limit
        stubbed += sum(1 for d in loop.decisions if d.to_form == "stub")
    assert stubbed > 0
    assert [h.assistant for h in conv.history] == [f"Answer {3 * t + 3}." for t in range(10)]
    assert store.conversation("conv-1") == ConversationInfo("conv-1")
    loaded = load_conversation(store, "conv-1", vault=VAULT)
    assert loaded.history == conv.history
    assert asyncio.run(session.get_items(limit=2)) == [
        {"role": "user", "content": "Question 9?"},
        {"role": "assistant", "content": "Answer 30."},
    ]
    store.close()
