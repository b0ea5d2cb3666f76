"""The pydantic-ai history processor with pydantic-ai's own FunctionModel (no network)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from pydantic_ai import Agent, AgentRunResult, CallToolsNode, RunContext
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.anthropic import AnthropicModel, AnthropicModelSettings
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from lamina import Conversation
from lamina.adapters.pydantic_ai import LaminaHistory
from lamina.pipeline import Budget, DecisionAction
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.tokens import TurnUsage, read_usage
from lamina.renderers import (
    agent_request,
    classify_break,
    instructions_tokens,
    render_request,
    tool_tokens,
    usage_record,
)
from tests.lamina.wire import (
    anthropic_blocks,
    anthropic_served,
    chat_reply,
    recording_chat,
    search_or_answer,
    served_prefix,
)

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"


def openai_form(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """pydantic-ai messages in OpenAI chat form, to compare with Lamina's request."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    out.append({"role": "system", "content": part.content})
                elif isinstance(part, UserPromptPart):
                    out.append({"role": "user", "content": part.content})
                elif isinstance(part, ToolReturnPart):
                    out.append(
                        {"role": "tool", "tool_call_id": part.tool_call_id, "content": part.content}
                    )
            continue
        text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
        calls = [
            {
                "id": p.tool_call_id,
                "type": "function",
                "function": {"name": p.tool_name, "arguments": p.args_as_json_str()},
            }
            for p in message.parts
            if isinstance(p, ToolCallPart)
        ]
        if calls:
            out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        else:
            out.append({"role": "assistant", "content": text})
    return out


def _result(q: str) -> str:
    return f"Results for {q}: " + " ".join(f"finding-{i} about the sync engine" for i in range(150))


class Scripted:
    """A model that searches twice per question, then answers; it records what it got."""

    def __init__(self) -> None:
        self.received: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.received.append(list(messages))
        steps = sum(
            1
            for m in messages
            if isinstance(m, ModelResponse) and any(isinstance(p, ToolCallPart) for p in m.parts)
        )
        turn = len(self.received)
        if steps < 2:
            return ModelResponse(
                parts=[ToolCallPart("search", json.dumps({"q": f"r{turn}"}), f"call-{turn}")]
            )
        return ModelResponse(parts=[TextPart(f"Answer after {steps} searches.")])


def _agent(history: LaminaHistory, model: Scripted) -> Agent[None, str]:
    agent = Agent(FunctionModel(model), capabilities=[ProcessHistory(history)])

    @agent.tool_plain
    def search(q: str) -> str:
        return _result(q)

    return agent


def test_a_plain_turn_is_lamina_rendering() -> None:
    """No tools: the model receives the envelope's system, history and user message."""
    conv = Conversation("You are terse.", vault=VAULT)
    history = LaminaHistory(conv)
    received: list[list[ModelMessage]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        received.append(list(messages))
        return ModelResponse(parts=[TextPart("It is a spec.")])

    agent = Agent(FunctionModel(answer), capabilities=[ProcessHistory(history)])
    history.attach({"note": "project-spec.md"})
    result = agent.run_sync("Summarize this")
    history.finish(result.output)
    first = history.loops[-1].envelope
    assert openai_form(received[0]) == render_request(first, "openai").body["messages"]
    assert "project-spec" in first.user_text
    result = agent.run_sync("Shorter, please")
    history.finish(result.output)
    second = history.loops[-1].envelope
    assert second.turn == 2
    assert openai_form(received[1]) == render_request(second, "openai").body["messages"]
    assert conv.history[0].assistant == "It is a spec."


def test_ten_turns_with_tools_under_a_small_budget() -> None:
    """Every request equals Lamina's fitted loop, keeps each call with its return, and fits."""
    budget = Budget(context_window=2400, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    model = Scripted()
    agent = _agent(history, model)
    for i in range(10):
        if i % 3 == 0:
            history.attach({"note": "project-spec.md"})
        result = agent.run_sync(f"Question {i}: what does the sync engine do?")
        history.finish(result.output)
    assert len(model.received) == len(history.loops) == 30
    stubbed = 0
    for messages, loop in zip(model.received, history.loops, strict=True):
        assert openai_form(messages) == agent_request(loop, "openai").body["messages"]
        calls = [p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolCallPart)]
        returns = [
            p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolReturnPart)
        ]
        assert calls == returns
        assert budget.effective(loop.tokens) <= budget.limit <= 2100
        stubbed += sum(1 for d in loop.decisions if d.to_form == "stub")
    assert stubbed > 0  # the budget had to act: the test exercises the fitting
    assert [h.assistant for h in conv.history] == ["Answer after 2 searches."] * 10


def test_instructions_system_prompt_and_tools_are_counted_and_kept() -> None:
    """What pydantic-ai adds is in the budget: its instructions (a system message of its
    own) and the tool definitions are counted, and ``system_prompt`` goes into L1's
    mutable part; the whole request as the model gets it fits window - reserve."""
    budget = Budget(context_window=3500, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    model = Scripted()
    seen: list[tuple[str | None, list[dict[str, Any]]]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tools = [
            {"name": t.name, "description": t.description, "parameters": t.parameters_json_schema}
            for t in info.function_tools
        ]
        seen.append((info.instructions, tools))
        return model(messages, info)

    agent = _searching_agent(FunctionModel(answer), history)
    for i in range(3):
        history.attach({"note": "project-spec.md"})
        history.finish(agent.run_sync(f"Question {i}: what does the sync engine do?").output)
    assert len(model.received) == len(history.loops) == len(seen) == 9
    for messages, loop, (sent_instructions, tools) in zip(
        model.received, history.loops, seen, strict=True
    ):
        assert openai_form(messages) == agent_request(loop, "openai").body["messages"]
        system = messages[0].parts[0]
        assert isinstance(system, SystemPromptPart)
        assert "results.\n\nCite the note you used." in system.content
        assert sent_instructions == INSTRUCTIONS
        added = budget.framing.per_message + conv.counter.count(INSTRUCTIONS)
        added += tool_tokens(tools, "openai", conv.counter)
        assert history.state.agent is not None
        steps = history.state.agent.loop_tokens(loop.steps)
        assert loop.tokens == budget.used(loop.envelope, conv.counter) + added + steps
        assert budget.effective(loop.tokens) <= budget.limit
    assert conv.system.mutable == "Cite the note you used."
    assert history.state.tools == seen[-1][1]  # for usage_record(tools=)


INSTRUCTIONS = " ".join(["Answer in one short paragraph."] * 20)
RULES = "\n".join(f"Rule {i}: cite the note and the section you used." for i in range(150))


def _searching_agent(model: Any, history: LaminaHistory) -> Agent[None, str]:
    """An agent with pydantic-ai's own additions (long instructions, a system prompt and a
    ``search`` tool) whose history Lamina processes."""
    agent = Agent(
        model,
        capabilities=[ProcessHistory(history)],
        instructions=INSTRUCTIONS,
        system_prompt="Cite the note you used.",
    )

    @agent.tool_plain
    def search(q: str) -> str:
        """Search the project notes."""
        return _result(q)

    return agent


def _chat_model(handle: Callable[[httpx.Request], httpx.Response]) -> OpenAIChatModel:
    """pydantic-ai's own OpenAI chat model whose requests ``handle`` answers in process."""
    transport = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    client = AsyncOpenAI(api_key="offline", http_client=transport)  # type: ignore[arg-type]
    return OpenAIChatModel("gpt-4o", provider=OpenAIProvider(openai_client=client))


def _wire_model(bodies: list[dict[str, Any]]) -> OpenAIChatModel:
    """pydantic-ai's own OpenAI chat model on an in-process transport: each request body is
    recorded as the framework would send it; the model searches twice, then answers."""
    return _chat_model(recording_chat(bodies))


def test_the_request_pydantic_ai_sends_is_counted_exactly_and_fits() -> None:
    """The body pydantic-ai's OpenAI model sends (its instructions as a system message of
    their own, Lamina's messages, the tool definitions), counted message by message, is
    Lamina's count of the loop exactly, and within window - reserve."""
    bodies: list[dict[str, Any]] = []
    budget = Budget(context_window=2400, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    agent = _searching_agent(_wire_model(bodies), history)
    for i in range(3):
        history.attach({"note": "project-spec.md"})
        history.finish(agent.run_sync(f"Question {i}?").output)
    counter, framing = conv.counter, budget.framing

    def sent(body: dict[str, Any]) -> int:
        total = framing.priming
        for m in body["messages"]:
            total += framing.per_message + counter.count(m.get("content") or "")
            for call in m.get("tool_calls") or ():
                fn = call["function"]
                total += framing.tool_call + counter.count(fn["name"] + fn["arguments"])
        tools = [t["function"] for t in body.get("tools", [])]
        return total + tool_tokens(tools, "openai", counter)

    assert len(bodies) == len(history.loops) == 9
    for body, loop in zip(bodies, history.loops, strict=True):
        assert [m["role"] for m in body["messages"][:2]] == ["system", "system"]
        assert sent(body) == loop.tokens <= budget.limit
    assert any(d.to_form == "stub" for loop in history.loops for d in loop.decisions)
    assert [h.assistant for h in conv.history] == ["Answer 3.", "Answer 6.", "Answer 9."]


def _billing_model(
    bodies: list[dict[str, Any]], billed: list[dict[str, Any]], counter: Any, budget: Budget
) -> OpenAIChatModel:
    """pydantic-ai's OpenAI chat model on an in-process transport that bills like a provider
    with a prefix cache: ``prompt_tokens`` is the body as sent, counted message by message;
    ``cached_tokens`` the leading run of tool definitions and messages an earlier body
    shares whole, in 128-token steps from 1,024 (OpenAI's rules). The model searches twice
    (text with each call), then answers."""
    framing = budget.framing

    def units(body: dict[str, Any]) -> list[tuple[str, int]]:
        tools = [t["function"] for t in body.get("tools", [])]
        out = [(json.dumps(tools), tool_tokens(tools, "openai", counter))]
        for m in body["messages"]:
            tokens = framing.per_message + counter.count(m.get("content") or "")
            for call in m.get("tool_calls") or ():
                fn = call["function"]
                tokens += framing.tool_call + counter.count(fn["name"] + fn["arguments"])
            out.append((json.dumps(m, sort_keys=True), tokens))
        return out

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        mine = units(body)
        cached = served_prefix(mine, [units(b) for b in bodies])
        bodies.append(body)
        n = len(bodies)
        prompt = framing.priming + sum(tokens for _, tokens in mine)
        usage = {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        billed.append(usage)
        return httpx.Response(200, json=chat_reply(n, search_or_answer(body, n), usage))

    return _chat_model(handle)


def test_each_request_of_a_run_is_read_back_from_pydantic_ais_own_usage() -> None:
    """Two runs of three requests through pydantic-ai's OpenAI model: each response's
    ``usage`` (pydantic-ai's ``RequestUsage``, its cache reads within ``input_tokens``) is
    read back against that request (``history.loops[i]``): input, cached and output
    tokens are the provider's, the predicted input is the provider's count exactly and
    calls 2 and 3 predict the prefix served, with no warning. (Before, the cache reads
    were read as 0, so each of those calls warned of a cache miss.) The run's summed
    usage is refused."""
    bodies: list[dict[str, Any]] = []
    billed: list[dict[str, Any]] = []
    budget = Budget(context_window=16000, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    model = _billing_model(bodies, billed, conv.counter, budget)
    agent = Agent(model, capabilities=[ProcessHistory(history)], system_prompt="Cite the note.")

    @agent.tool_plain
    def search(q: str) -> str:
        """Search the project notes."""
        return _result(q)

    responses, result = _read_back_runs(agent, history)
    assert len(responses) == len(history.loops) == len(bodies) == 6
    with pytest.raises(ConfigError, match="sums 3 requests"):
        read_usage(result.usage)
    records = []
    for n, response in enumerate(responses):
        read = usage_record(history.loops[: n + 1], response.usage, "openai", "gpt-4o",
                            tools=history.state.tools)  # fmt: skip
        records.append(read)
    observed = [u.observed for u in records]
    assert [(o.input_tokens, o.cached_tokens, o.output_tokens) for o in observed] == [
        (b["prompt_tokens"], b["prompt_tokens_details"]["cached_tokens"], 7) for b in billed
    ]
    assert [u.predicted_input for u in records] == [o.input_tokens for o in observed]
    assert [o.cached_tokens > 0 for o in observed] == [False, True, True, False, True, True]
    for u in (records[1], records[2], records[4], records[5]):
        assert u.predicted_cached == u.observed.cached_tokens
    assert all(u.warning is None for u in records)
    assert [(u.turn, u.call) for u in records] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]


def _read_back_runs(
    agent: Agent[Any, str], history: LaminaHistory, deps: Any = None, attach: bool = True
) -> tuple[list[ModelResponse], AgentRunResult[str]]:
    """Two runs of an agent through ``agent.iter`` (each with the spec note attached, or
    none): each model request's response, as it came, and the last run's result."""
    responses: list[ModelResponse] = []

    async def run(question: str) -> AgentRunResult[str]:
        async with agent.iter(question, deps=deps) as running:
            async for node in running:
                if isinstance(node, CallToolsNode):
                    responses.append(node.model_response)
        assert running.result is not None
        return running.result

    for i in range(2):
        if attach:
            history.attach({"note": "project-spec.md"})
        result = asyncio.run(run(f"Question {i}: what does the sync engine do?"))
        history.finish(result.output)
    return responses, result


def _read_back(history: LaminaHistory, responses: list[ModelResponse]) -> list[TurnUsage]:
    """Each response's usage read back against its request, with the instructions it sent."""
    return [
        usage_record(history.loops[: n + 1], r.usage, "openai", "gpt-4o",
                     tools=history.state.tools, instructions=history.instructions[n])
        for n, r in enumerate(responses)
    ]  # fmt: skip


def test_instructions_are_in_the_predicted_input_of_every_request() -> None:
    """``Agent(instructions=...)``, sent by pydantic-ai as a system message of its own after
    Lamina's: with ``instructions=history.instructions[n]`` each request's predicted input
    is the provider's billed prompt tokens exactly, calls 2 and 3 predict the prefix served
    (the instructions within it) and nothing warns. Without them the prediction is short
    by exactly their tokens (before: it always was)."""
    bodies: list[dict[str, Any]] = []
    billed: list[dict[str, Any]] = []
    budget = Budget(context_window=16000, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    agent = _searching_agent(_billing_model(bodies, billed, conv.counter, budget), history)
    responses, _ = _read_back_runs(agent, history)
    assert len(responses) == len(history.loops) == len(history.instructions) == len(bodies) == 6
    assert all(body["messages"][1] == {"role": "system", "content": INSTRUCTIONS}
               for body in bodies)  # fmt: skip
    assert history.instructions == [(INSTRUCTIONS,)] * 6
    records, short = [], []
    for n, response in enumerate(responses):
        loops = history.loops[: n + 1]
        records.append(usage_record(loops, response.usage, "openai", "gpt-4o",
                                    tools=history.state.tools,
                                    instructions=history.instructions[n]))  # fmt: skip
        short.append(usage_record(loops, response.usage, "openai", "gpt-4o",
                                  tools=history.state.tools))  # fmt: skip
    assert [u.predicted_input for u in records] == [b["prompt_tokens"] for b in billed]
    assert [u.counted for u in records] == [loop.tokens for loop in history.loops]
    cached = [b["prompt_tokens_details"]["cached_tokens"] for b in billed]
    assert [c > 0 for c in cached] == [False, True, True, False, True, True]
    assert [u.predicted_cached for u in records] == [0, *cached[1:3], 0, *cached[4:]]
    assert all(u.warning is None for u in records)
    added = instructions_tokens([INSTRUCTIONS], conv.counter, budget.framing.per_message)
    assert added > 100
    assert [u.predicted_input + added for u in short] == [b["prompt_tokens"] for b in billed]


def test_dynamic_instructions_are_in_the_predicted_input() -> None:
    """``@agent.instructions`` functions (evaluated per request, here from the run's deps)
    reach the request as pydantic-ai records it: each request's predicted input with
    ``history.instructions[n]`` is the billed prompt tokens exactly, and the budget counted
    them (``Loop.tokens`` is the body as billed)."""
    bodies: list[dict[str, Any]] = []
    billed: list[dict[str, Any]] = []
    budget = Budget(context_window=16000, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    agent = Agent(_billing_model(bodies, billed, conv.counter, budget), deps_type=str,
                  capabilities=[ProcessHistory(history)])  # fmt: skip

    @agent.instructions
    def house_rules(ctx: RunContext[str]) -> str:
        return f"Answer for {ctx.deps}. " + INSTRUCTIONS

    @agent.tool_plain
    def search(q: str) -> str:
        """Search the project notes."""
        return _result(q)

    responses, _ = _read_back_runs(agent, history, deps="the sync team")
    rules = "Answer for the sync team. " + INSTRUCTIONS
    assert history.instructions == [(rules,)] * 6
    assert all(body["messages"][1] == {"role": "system", "content": rules} for body in bodies)
    predicted = _read_back(history, responses)
    assert [u.predicted_input for u in predicted] == [b["prompt_tokens"] for b in billed]
    assert [loop.tokens for loop in history.loops] == [b["prompt_tokens"] for b in billed]
    assert all(u.warning is None for u in predicted)


def test_static_and_dynamic_instructions_are_counted_as_the_messages_sent() -> None:
    """A static ``instructions=`` and an ``@agent.instructions`` function go out as two
    system messages; a history processor sees them joined, ``history.capability()`` sees
    the parts: the budget (``Loop.tokens``) and each request's predicted input are the
    billed prompt tokens exactly, and the cache prediction is the prefix served."""
    bodies: list[dict[str, Any]] = []
    billed: list[dict[str, Any]] = []
    budget = Budget(context_window=16000, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    agent = Agent(_billing_model(bodies, billed, conv.counter, budget), deps_type=str,
                  instructions=INSTRUCTIONS, capabilities=[history.capability()])  # fmt: skip

    @agent.instructions
    def audience(ctx: RunContext[str]) -> str:
        return f"Answer for {ctx.deps}."

    @agent.tool_plain
    def search(q: str) -> str:
        """Search the project notes."""
        return _result(q)

    responses, _ = _read_back_runs(agent, history, deps="the sync team")
    sent = (INSTRUCTIONS, "Answer for the sync team.")
    assert history.instructions == [sent] * 6
    for body in bodies:
        assert [m["content"] for m in body["messages"][1:3]] == list(sent)
    records = _read_back(history, responses)
    assert [u.predicted_input for u in records] == [b["prompt_tokens"] for b in billed]
    assert [loop.tokens for loop in history.loops] == [b["prompt_tokens"] for b in billed]
    cached = [b["prompt_tokens_details"]["cached_tokens"] for b in billed]
    assert [u.predicted_cached for u in records] == [0, *cached[1:3], 0, *cached[4:]]
    assert all(u.warning is None for u in records)
    joined = instructions_tokens(["\n\n".join(sent)], conv.counter)
    assert joined < instructions_tokens(sent, conv.counter)  # the processor alone counts short


def test_a_changed_dynamic_instruction_is_a_reported_break() -> None:
    """An ``@agent.instructions`` function whose text changes every request (here it counts
    them) breaks the prefix after Lamina's system message: each request after the first
    carries an ``instructions-changed`` decision and warning, ``classify_break`` names it,
    and the read-back predicts the prefix the provider served (tools and system message)
    with no cache-miss warning. (Before, nothing said why, and the loop's calls predicted
    the whole earlier request cached.)"""
    bodies: list[dict[str, Any]] = []
    billed: list[dict[str, Any]] = []
    budget = Budget(context_window=16000, reserve_output=300)
    conv = Conversation(RULES, vault=VAULT, budget=budget)
    history = LaminaHistory(conv)
    agent = Agent(_billing_model(bodies, billed, conv.counter, budget),
                  capabilities=[history.capability()])  # fmt: skip
    sent: list[int] = []

    @agent.instructions
    def progress() -> str:
        sent.append(len(sent) + 1)
        return f"This is request {len(sent)} of the run. " + INSTRUCTIONS

    @agent.tool_plain
    def search(q: str) -> str:
        """Search the project notes."""
        return _result(q)

    responses, _ = _read_back_runs(agent, history, attach=False)
    assert len(responses) == len(history.loops) == len(bodies) == 6
    assert len(set(history.instructions)) == 6
    envelopes = [loop.envelope for loop in history.loops]
    changed = [
        [d.action for d in env.report.decisions if d.action is DecisionAction.INSTRUCTIONS_CHANGED]
        for env in envelopes
    ]
    assert changed == [[]] + [[DecisionAction.INSTRUCTIONS_CHANGED]] * 5
    assert all(
        any(w.code == "instructions-changed" for w in env.report.warnings) for env in envelopes[1:]
    )
    breaks = [classify_break(a, b) for a, b in itertools.pairwise(envelopes)]
    assert all("instructions-changed" in reasons for reasons in breaks)
    records = _read_back(history, responses)
    cached = [b["prompt_tokens_details"]["cached_tokens"] for b in billed]
    assert all(c > 0 for c in cached[1:])  # the tools and the system message, every call
    assert [u.predicted_cached for u in records] == cached
    assert all(u.warning is None for u in records)


def _anthropic_model(bodies: list[dict[str, Any]]) -> AnthropicModel:
    """pydantic-ai's own Anthropic model on Anthropic's SDK with an in-process transport:
    each request body is recorded; it searches twice a run (text with each call), then
    answers."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = len(bodies)
        searches = sum(1 for b in anthropic_blocks(body) if b.get("type") == "tool_use")
        content: list[dict[str, Any]] = [{"type": "text", "text": f"Step {n}."}]
        if searches < 2:
            content.append({"type": "tool_use", "id": f"t{n}", "name": "search",
                            "input": {"q": f"q{n}"}})  # fmt: skip
        return httpx2.Response(200, json={
            "id": f"m{n}", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
            "content": content, "usage": {"input_tokens": 5, "output_tokens": 5},
            "stop_reason": "tool_use" if searches < 2 else "end_turn", "stop_sequence": None,
        })  # fmt: skip

    transport = httpx2.AsyncClient(transport=httpx2.MockTransport(handle))
    client = AsyncAnthropic(api_key="offline", http_client=transport)
    return AnthropicModel("claude-sonnet-4-6", provider=AnthropicProvider(anthropic_client=client))


def _marks(body: dict[str, Any]) -> list[tuple[int, int]]:
    """(message, block) of each block of an Anthropic body's messages with a breakpoint."""
    return [
        (m, b)
        for m, message in enumerate(body["messages"])
        for b, block in enumerate(message["content"])
        if "cache_control" in block
    ]


CACHE_BOTH = AnthropicModelSettings(
    max_tokens=1024, anthropic_cache_instructions=True, anthropic_cache_messages=True
)
CACHE_SYSTEM = AnthropicModelSettings(max_tokens=1024, anthropic_cache_instructions=True)


@pytest.mark.parametrize(
    ("settings", "defer"),
    [(CACHE_BOTH, True), (CACHE_SYSTEM, True), (CACHE_SYSTEM, False)],
    ids=["instructions-and-messages", "instructions", "instructions-library-in-system"],
)
def test_anthropic_loop_requests_carry_laminas_breakpoints(
    settings: AnthropicModelSettings, defer: bool
) -> None:
    """pydantic-ai's Anthropic model sends Lamina's breakpoints in the messages, where
    Lamina's own request for the same loop call puts them (the end of the history, the
    end of a deferred turn, the loop's last tool result: ``CachePoint``s), whether or not
    ``anthropic_cache_messages`` is set; ``anthropic_cache_instructions`` marks the
    system message's end. Every request of two runs of three calls has at most four, and
    the next call of a loop reads the whole request before it. (Before, with only
    ``anthropic_cache_instructions`` no message had a breakpoint: on six runs of this
    kind 0.345 of the input was served from the cache, 0.83 now and with both settings.
    And before that, the loop calls of a turn with deferred context were built as a new
    turn: pydantic-ai hands back the user message as sent, which was not taken for the
    turn's.)"""
    bodies: list[dict[str, Any]] = []
    conv = Conversation(RULES, vault=VAULT, defer_library=defer)
    history = LaminaHistory(conv, provider="anthropic")
    agent = Agent(_anthropic_model(bodies), capabilities=[history.capability()],
                  model_settings=settings)  # fmt: skip

    @agent.tool_plain
    def search(q: str) -> str:
        """Search the project notes."""
        return _result(q)

    for i in range(2):
        history.attach({"note": "project-spec.md"})
        history.finish(agent.run_sync(f"Question {i}?").output)
    assert len(bodies) == len(history.loops) == 6
    assert [h.user for h in conv.history] == ["Question 0?", "Question 1?"]
    assert history.loops[4].envelope == history.loops[3].envelope == history.loops[5].envelope
    for body, loop in zip(bodies, history.loops, strict=True):
        assert "cache_control" in body["system"][-1]
        assert "cache_control" in anthropic_blocks(body)[-1]
        assert _marks(body) == _marks(agent_request(loop, "anthropic").body)
        assert json.dumps(body).count("cache_control") <= 4
    assert _marks(bodies[3])[0] == (1, 0)  # run 2: the history's end (the first answer)
    for n in (1, 2, 4, 5):
        whole = anthropic_served(bodies[n - 1], bodies[n - 1 : n], conv.counter)
        assert whole > 0
        assert anthropic_served(bodies[n], bodies[:n], conv.counter) == whole
