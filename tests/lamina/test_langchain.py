"""LangChain: envelope messages, and a create_agent run with a fake chat model (offline)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anthropic
import httpx2
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, dynamic_prompt
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import SecretStr

from lamina import Conversation
from lamina.adapters.langchain import LaminaMiddleware, to_messages
from lamina.pipeline import Budget, DecisionAction
from lamina.pipeline.tokens import read_usage
from lamina.renderers import agent_request, render_request, tool_tokens, usage_record
from tests.lamina.wire import anthropic_blocks, anthropic_served, chat_tokens

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"
RULES = "\n".join(f"Rule {i}: cite the note and the section you used." for i in range(400))


def _normal(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages with tool arguments parsed and empty contents as None."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["content"] = m.get("content") or None
            m["tool_calls"] = [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "args": json.loads(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


class Scripted(GenericFakeChatModel):
    """A fake chat model that records what it is sent; tools are accepted and ignored."""

    received: ClassVar[list[list[BaseMessage]]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def _script(turns: int) -> Iterator[AIMessage]:
    for t in range(turns):
        for s in range(2):
            call = {"name": "search", "args": {"q": f"r{t}-{s}"}, "id": f"c{t}{s}"}
            yield AIMessage(content="", tool_calls=[call])
        yield AIMessage(content=f"Answer {t}.")


@tool
def search(q: str) -> str:
    """Search the project notes."""
    return f"Results for {q}: " + " ".join(f"finding-{i} on sync" for i in range(150))


def test_anthropic_messages_carry_cache_control_blocks() -> None:
    conv = Conversation(RULES, vault=VAULT)
    env = conv.turn("Summarize", [{"note": "project-spec.md"}])
    messages = to_messages(env, "anthropic", "claude-sonnet-4-6")
    body = render_request(env, "anthropic", "claude-sonnet-4-6").body
    assert messages[0].content == body["system"]
    assert any("cache_control" in b for b in body["system"])
    assert messages[-1].content == body["messages"][-1]["content"]
    plain = to_messages(env)
    assert convert_to_openai_messages(plain) == render_request(env, "openai").body["messages"]


def test_anthropic_messages_carry_every_breakpoint_lamina_sets() -> None:
    """ChatAnthropic's own request payload of ``to_messages`` is Lamina's Anthropic body:
    the system blocks, the history (with its breakpoint) and the turn, byte for byte."""
    conv = Conversation(RULES, vault=VAULT)
    for i in range(3):
        conv.turn(f"Question {i}: " + "why? " * 300, [{"note": "project-spec.md"}])
        conv.reply(f"Answer {i}: " + "because " * 300)
    env = conv.turn("Summarize", [{"note": "project-spec.md"}])
    body = render_request(env, "anthropic", "claude-sonnet-4-6").body
    offline = SecretStr("offline")
    chat = ChatAnthropic(model_name="claude-sonnet-4-6", api_key=offline)  # type: ignore[call-arg]
    payload = chat._get_request_payload(to_messages(env, "anthropic", "claude-sonnet-4-6"))
    assert payload["system"] == body["system"]
    assert payload["messages"] == body["messages"]
    marked = [
        m["role"] for m in body["messages"] if any("cache_control" in b for b in m["content"])
    ]
    # The history's breakpoint and, since the next request extends this one (the
    # library's growth is deferred), the end of this turn.
    assert marked == ["assistant", "user"], "every breakpoint is carried"
    assert json.dumps(payload).count("cache_control") == json.dumps(body).count("cache_control")


def _scripted_agent(conv: Conversation, turns: int) -> tuple[LaminaMiddleware, Scripted, Any]:
    """A create_agent run's parts: Lamina's middleware on ``conv``, the scripted model
    (two searches a turn, then the answer) and the agent."""
    lamina = LaminaMiddleware(conv)
    model = Scripted(messages=_script(turns))
    model.received.clear()
    return lamina, model, create_agent(model, tools=[search], middleware=[lamina])


def test_ten_turn_agent_under_a_small_budget() -> None:
    budget = Budget(context_window=2400, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    lamina, model, agent = _scripted_agent(conv, 10)
    for i in range(10):
        if i % 3 == 0:
            lamina.attach({"note": "project-spec.md"})
        state = agent.invoke({"messages": [{"role": "user", "content": f"Question {i}?"}]})
        lamina.finish(state["messages"][-1].text)
    assert len(model.received) == len(lamina.loops) == 30
    stubbed = 0
    for received, loop in zip(model.received, lamina.loops, strict=True):
        sent = _normal(convert_to_openai_messages(received))
        assert sent == _normal(agent_request(loop, "openai").body["messages"])
        calls = [c["id"] for m in received if isinstance(m, AIMessage) for c in m.tool_calls]
        returns = [m.tool_call_id for m in received if isinstance(m, ToolMessage)]
        assert calls == returns
        assert budget.effective(loop.tokens) <= budget.limit
        stubbed += sum(1 for d in loop.decisions if d.to_form == "stub")
    assert stubbed > 0
    assert [h.assistant for h in conv.history] == [f"Answer {t}." for t in range(10)]


def test_the_agents_system_prompt_and_tools_are_kept_and_counted() -> None:
    """``create_agent(system_prompt=...)`` goes into L1's mutable part (it was replaced by
    Lamina's system message and lost); the tool definitions are counted in every loop."""
    budget = Budget(context_window=2400, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    lamina = LaminaMiddleware(conv)
    model = Scripted(messages=_script(1))
    model.received.clear()
    agent = create_agent(
        model, tools=[search], middleware=[lamina], system_prompt="Cite the note you used."
    )
    state = agent.invoke({"messages": [{"role": "user", "content": "Question?"}]})
    lamina.finish(state["messages"][-1].text)
    assert conv.system.mutable == "Cite the note you used."
    defs = [convert_to_openai_tool(search)["function"]]
    added = tool_tokens(defs, "openai", conv.counter)
    assert added > 20
    assert lamina.state.tools == defs  # for usage_record(tools=)
    for received, loop in zip(model.received, lamina.loops, strict=True):
        assert "results.\n\nCite the note you used." in received[0].text
        assert lamina.state.agent is not None
        steps = lamina.state.agent.loop_tokens(loop.steps)
        assert loop.tokens == budget.used(loop.envelope, conv.counter) + added + steps
        assert budget.effective(loop.tokens) <= budget.limit


def test_a_system_prompt_rewritten_between_calls_is_sent_as_l1s_mutable_part() -> None:
    """A ``dynamic_prompt`` middleware that changes the prompt once the loop has a tool
    result: the next calls carry the new prompt in L1's mutable part (a ``handoff``
    decision), counted; the conversation keeps the prompt the turn started with."""
    budget = Budget(context_window=4000, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    lamina = LaminaMiddleware(conv)
    model = Scripted(messages=_script(1))
    model.received.clear()

    @dynamic_prompt
    def prompt(request: ModelRequest) -> str:
        found = any(isinstance(m, ToolMessage) for m in request.messages)
        return "Answer from what you found." if found else "Search first."

    agent = create_agent(model, tools=[search], middleware=[prompt, lamina])
    state = agent.invoke({"messages": [{"role": "user", "content": "Question?"}]})
    lamina.finish(state["messages"][-1].text)
    assert [r[0].text.split("\n\n")[1] for r in model.received] == [
        "Search first.",
        "Answer from what you found.",
        "Answer from what you found.",
    ]
    decisions = [
        [d.action for d in loop.envelope.report.decisions if d.layer == "L1"]
        for loop in lamina.loops
    ]
    assert decisions == [[], [DecisionAction.HANDOFF], [DecisionAction.HANDOFF]]
    defs = [convert_to_openai_tool(search)["function"]]
    added = tool_tokens(defs, "openai", conv.counter)
    assert lamina.state.agent is not None
    for received, loop in zip(model.received, lamina.loops, strict=True):
        assert received[0].text == loop.envelope.system_text
        steps = lamina.state.agent.loop_tokens(loop.steps)
        assert loop.tokens == budget.used(loop.envelope, conv.counter) + added + steps
    assert conv.system.mutable == "Search first."
    assert [h.assistant for h in conv.history] == ["Answer 0."]


def _anthropic_model(
    billed: list[dict[str, Any]], bodies: list[dict[str, Any]] | None = None
) -> ChatAnthropic:
    """LangChain's own ChatAnthropic on Anthropic's SDK with an in-process transport: it
    searches twice a run, then answers; each reply's usage (Anthropic's raw form, cache
    reads and writes apart from ``input_tokens``) is kept in ``billed``, each request body
    in ``bodies``."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if bodies is not None:
            bodies.append(body)
        searches = sum(1 for b in anthropic_blocks(body) if b["type"] == "tool_use")
        n = len(billed) + 1
        usage = {"input_tokens": 40 + n, "output_tokens": 9, "cache_read_input_tokens":
                 1024 * (n - 1), "cache_creation_input_tokens": 300 * n}  # fmt: skip
        billed.append(usage)
        content: list[dict[str, Any]] = [{"type": "text", "text": f"Step {n}."}]
        if searches < 2:
            content.append({"type": "tool_use", "id": f"t{n}", "name": "search",
                            "input": {"q": f"q{n}"}})  # fmt: skip
        reply = {"id": f"m{n}", "type": "message", "role": "assistant",
                 "model": "claude-sonnet-4-6", "content": content, "usage": usage,
                 "stop_reason": "tool_use" if searches < 2 else "end_turn",
                 "stop_sequence": None}  # fmt: skip
        return httpx2.Response(200, json=reply)

    model = ChatAnthropic(model="claude-sonnet-4-6", api_key=SecretStr("offline"), max_tokens=1024)
    transport = httpx2.Client(transport=httpx2.MockTransport(handle))
    model.__dict__["_client"] = anthropic.Anthropic(api_key="offline", http_client=transport)
    return model


def test_each_model_call_is_read_back_from_langchains_own_usage() -> None:
    """A create_agent run of three calls to LangChain's ChatAnthropic: each AIMessage's
    ``usage_metadata`` (LangChain's, cache reads and writes within ``input_tokens``, in
    ``input_token_details``) reads back as Anthropic's own usage of that call, against
    that call's request (``lamina.loops[i]``). (Before, the cache reads and writes were
    read as 0, so calls 2 and 3 warned of a cache miss.)"""
    billed: list[dict[str, Any]] = []
    conv = Conversation("You answer from search results.", vault=VAULT)
    lamina = LaminaMiddleware(conv, "anthropic", "claude-sonnet-4-6")
    agent = create_agent(_anthropic_model(billed), tools=[search], middleware=[lamina])
    lamina.attach({"note": "project-spec.md"})
    state = agent.invoke({"messages": [{"role": "user", "content": "What changed?"}]})
    lamina.finish(state["messages"][-1].text)
    replies = [m for m in state["messages"] if isinstance(m, AIMessage)]
    assert len(replies) == len(lamina.loops) == len(billed) == 3
    tools = lamina.state.tools
    records = [
        usage_record(lamina.loops[: n + 1], reply, "anthropic", "claude-sonnet-4-6", tools=tools)
        for n, reply in enumerate(replies)
    ]
    assert [u.observed for u in records] == [read_usage(b, "anthropic") for b in billed]
    assert [(u.observed.cached_tokens, u.observed.cache_write_tokens) for u in records] == [
        (0, 300), (1024, 600), (2048, 900)
    ]
    assert [(u.turn, u.call) for u in records] == [(1, 1), (1, 2), (1, 3)]


def test_tool_call_arguments_are_counted_as_langchain_serializes_them() -> None:
    """LangChain sends a call's arguments as ``json.dumps`` writes them (``{"q": "r0-0"}``,
    with spaces): every request's count is the OpenAI chat body LangChain sends, counted
    message by message (it was Lamina's compact JSON, 1-2 tokens short a call)."""
    budget = Budget(context_window=8000, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    lamina, model, agent = _scripted_agent(conv, 2)
    for i in range(2):
        state = agent.invoke({"messages": [{"role": "user", "content": f"Question {i}?"}]})
        lamina.finish(state["messages"][-1].text)
    assert len(model.received) == len(lamina.loops) == 6
    defs = [convert_to_openai_tool(search)["function"]]
    sent = [convert_to_openai_messages(r) for r in model.received]

    def arguments(messages: list[dict[str, Any]]) -> list[str]:
        return [c["function"]["arguments"] for m in messages for c in m.get("tool_calls") or ()]

    assert arguments(sent[-1]) == ['{"q": "r1-0"}', '{"q": "r1-1"}']
    for messages, loop in zip(sent, lamina.loops, strict=True):
        ours = agent_request(loop, "openai").body["messages"]
        assert _normal(messages) == _normal(ours)
        assert arguments(messages) == arguments(ours)
        assert chat_tokens(messages, defs, budget.framing, conv.counter) == loop.tokens


def test_anthropic_loop_requests_end_with_a_breakpoint_the_next_call_reads() -> None:
    """Two runs of three calls through LangChain's ChatAnthropic: every request it sends is
    Lamina's Anthropic body (tool_use and tool_result blocks included), ends with a
    ``cache_control`` breakpoint on its last block, carries at most 4, and the next call
    of the loop reads the whole of it from the cache (before, calls 2 and 3 read only up
    to the turn's user message: the loop's steps carried no breakpoint)."""
    billed: list[dict[str, Any]] = []
    bodies: list[dict[str, Any]] = []
    conv = Conversation(RULES, vault=VAULT)
    lamina = LaminaMiddleware(conv, "anthropic", "claude-sonnet-4-6")
    agent = create_agent(_anthropic_model(billed, bodies), tools=[search], middleware=[lamina])
    for i in range(2):
        lamina.attach({"note": "project-spec.md"})
        state = agent.invoke({"messages": [{"role": "user", "content": f"Question {i}?"}]})
        lamina.finish(state["messages"][-1].text)
    assert len(bodies) == len(lamina.loops) == 6
    for body, loop in zip(bodies, lamina.loops, strict=True):
        ours = agent_request(loop, "anthropic", "claude-sonnet-4-6").body
        assert (body["system"], body["messages"]) == (ours["system"], ours["messages"])
        assert "cache_control" in anthropic_blocks(body)[-1]
        assert 1 <= json.dumps(body).count("cache_control") <= 4
    counter = conv.counter
    for n in (1, 2, 4, 5):  # calls 2 and 3 of each run
        whole = anthropic_served(bodies[n - 1], bodies[n - 1 : n], counter)
        assert whole > 0
        assert anthropic_served(bodies[n], bodies[:n], counter) == whole


def test_past_four_breakpoints_a_loop_keeps_l1s_stable_part_marked() -> None:
    """With a prompt rewritten between calls (L1's mutable part: a handoff) the turn's own
    request of run 2 uses all four breakpoints (L1's stable part, the system, the history,
    the turn); its loop's calls give up the turn's user message's (the first call wrote
    that prefix) and keep L1's stable part's, which the request after a handoff reads."""
    billed: list[dict[str, Any]] = []
    bodies: list[dict[str, Any]] = []
    conv = Conversation(RULES, vault=VAULT)
    lamina = LaminaMiddleware(conv, "anthropic", "claude-sonnet-4-6")

    @dynamic_prompt
    def prompt(request: ModelRequest) -> str:
        found = any(isinstance(m, ToolMessage) for m in request.messages)
        return "Answer from what you found." if found else "Search first."

    model = _anthropic_model(billed, bodies)
    agent = create_agent(model, tools=[search], middleware=[prompt, lamina])
    for i in range(2):
        lamina.attach({"note": "project-spec.md"})
        state = agent.invoke({"messages": [{"role": "user", "content": f"Question {i}?"}]})
        lamina.finish(state["messages"][-1].text)
    assert len(bodies) == 6
    marks = [json.dumps(body).count("cache_control") for body in bodies]
    assert marks[3:] == [4, 4, 4]
    for body in bodies:
        assert "cache_control" in body["system"][0]  # L1's stable part
        assert "cache_control" in anthropic_blocks(body)[-1]
    for steps, body in ((1, bodies[4]), (2, bodies[5])):
        user = body["messages"][-1 - 2 * steps]  # the turn's, before the steps' messages
        assert user["role"] == "user" and user["content"][-1]["type"] == "text"
        assert not any("cache_control" in b for b in user["content"])
