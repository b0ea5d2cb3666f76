"""OpenAI Agents SDK: the input filter and session with a fake Model (offline)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool
from agents.models.interface import Model
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from lamina import Conversation, export_transcript, import_transcript, load_conversation
from lamina.adapters.openai_agents import LaminaSession, final_answer
from lamina.pipeline import Budget, DecisionAction, SystemPrompt, check_envelope
from lamina.pipeline.errors import ConfigError, ConversationError
from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn
from lamina.renderers import (
    ANTHROPIC_TOOL_PROMPT,
    agent_request,
    annotate_trace,
    classify_break,
    explain_cache,
    tool_tokens,
    trace_document,
    usage_record,
)
from tests.lamina.wire import chat_tokens, recording_chat, responses_reply, served_prefix
from tests.stores import Backend

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


def _message(n: int, text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg-{n}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def _call(call_id: str, name: str = "search", q: str = "sync") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=name, arguments=json.dumps({"q": q})
    )


class Styled(Model):
    """Two tool steps per run, then an answer; each step in one model style: interim text
    with a call, a call alone, or several calls in one response."""

    def __init__(self, style: str) -> None:
        self.style = style
        self.received: list[list[dict[str, Any]]] = []

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [dict(i) for i in input]
        self.received.append(items)
        n = len(self.received)
        steps = sum(1 for i in items if i.get("type") == "function_call_output") // (
            2 if self.style == "several" else 1
        )
        output: list[Any]
        if steps >= 2:
            output = [_message(n, f"Answer {n}.")]
        elif self.style == "text+call":
            output = [_message(n, f"Let me search ({n})..."), _call(f"call-{n}", q=f"r{n}")]
        elif self.style == "call":
            output = [_call(f"call-{n}", q=f"r{n}")]
        else:
            output = [_call(f"call-{n}a", q=f"a{n}"), _call(f"call-{n}b", q=f"b{n}")]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def _user_texts(items: list[dict[str, Any]]) -> list[str]:
    return [str(i["content"]) for i in items if i.get("role") == "user"]


def _assistant_texts(items: list[dict[str, Any]]) -> list[str]:
    return [str(i["content"]) for i in items if i.get("role") == "assistant"]


@pytest.mark.parametrize("style", ["text+call", "call", "several"])
def test_a_turn_ends_only_with_the_runs_final_output(style: str, tmp_path: Path) -> None:
    """Interim text with a call stays in the loop: stored turns == runs, each run's query
    is sent once per request, each interim text once, right before its calls."""
    conv = Conversation("You answer from search results.", vault=VAULT)
    store = SqliteStore(tmp_path / "s.db")
    session = LaminaSession(conv, store, "conv-1")
    model = Styled(style)
    agent = Agent(name="notes", model=model, tools=[search])
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )

    async def run() -> list[str]:
        outputs = []
        for i in range(3):
            session.attach({"note": "project-spec.md"})
            result = await Runner.run(agent, f"Question {i}?", session=session, run_config=config)
            outputs.append(str(result.final_output))
        return outputs

    outputs = asyncio.run(run())
    assert outputs == ["Answer 3.", "Answer 6.", "Answer 9."]
    assert [h.assistant for h in conv.history] == outputs
    assert [h.user for h in conv.history] == ["Question 0?", "Question 1?", "Question 2?"]
    assert load_conversation(store, "conv-1", vault=VAULT).history == conv.history
    assert len(model.received) == 9
    for n, items in enumerate(model.received, start=1):
        run_index = (n - 1) // 3
        query = f"Question {run_index}?"
        assert _user_texts(items)[-1].endswith(query)
        assert sum(query in text for text in _user_texts(items)) == 1
        earlier = [f"Answer {3 * r + 3}." for r in range(run_index)]
        interim = [f"Let me search ({m})..." for m in range(3 * run_index + 1, n)]
        interim = interim if style == "text+call" else []
        assert _assistant_texts(items) == earlier + interim
        for text in interim:  # the interim text right before its call
            at = next(i for i, it in enumerate(items) if it.get("content") == text)
            assert items[at + 1]["type"] == "function_call"
        calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
        outputs_ = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
        assert sorted(calls) == sorted(outputs_)
        assert len(calls) == (n - 1) % 3 * (2 if style == "several" else 1)
    loop = session.loops[1]
    assert [s.text for s in loop.steps] == [
        "Let me search (1)..." if style == "text+call" else ""
    ]
    assert asyncio.run(session.get_items()) == [
        item
        for i in range(3)
        for item in (
            {"role": "user", "content": f"Question {i}?"},
            {"role": "assistant", "content": f"Answer {3 * i + 3}."},
        )
    ]
    store.close()


class Triage(Model):
    """Hands off to the researcher (with interim text), who searches once and answers."""

    def __init__(self) -> None:
        self.received: list[tuple[str | None, list[dict[str, Any]]]] = []

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [dict(i) for i in input]
        self.received.append((system_instructions, items))
        n = len(self.received)
        names = [i.get("name") for i in items if i.get("type") == "function_call"]
        output: list[Any]
        if not names:
            output = [_message(n, "Passing you on."), _call(f"h-{n}", "transfer_to_researcher")]
        elif "search" not in names:
            output = [_message(n, "Searching."), _call(f"s-{n}", q=f"q{n}")]
        else:
            output = [_message(n, f"Found it ({n}).")]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def test_a_handoff_stays_inside_the_turn(tmp_path: Path) -> None:
    conv = Conversation("You answer from search results.", vault=VAULT)
    session = LaminaSession(conv)
    model = Triage()
    researcher = Agent(name="researcher", model=model, tools=[search])
    triage = Agent(name="triage", model=model, handoffs=[researcher])
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )

    async def run() -> None:
        for i in range(2):
            await Runner.run(triage, f"Question {i}?", session=session, run_config=config)

    asyncio.run(run())
    assert [(h.user, h.assistant) for h in conv.history] == [
        ("Question 0?", "Found it (3)."),
        ("Question 1?", "Found it (6)."),
    ]
    assert len(model.received) == 6
    last = model.received[-1][1]
    assert sum("Question 1?" in t for t in _user_texts(last)) == 1
    assert _assistant_texts(last) == ["Found it (3).", "Passing you on.", "Searching."]
    assert [s.text for s in session.loops[-1].steps] == ["Passing you on.", "Searching."]
    assert [c.name for s in session.loops[-1].steps for c in s.calls] == [
        "transfer_to_researcher",
        "search",
    ]


def test_final_answer_is_the_last_message_no_call_follows() -> None:
    msg = {"type": "message", "role": "assistant", "content": "Let me look."}
    call = {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "x"}
    done = {"type": "message", "role": "assistant", "content": "Done."}
    assert final_answer([msg, call, out]) is None
    assert final_answer([call, out]) is None
    assert final_answer([{"role": "user", "content": "Hi"}]) is None
    assert final_answer([done]) == "Done."
    assert final_answer([msg, call, out, done]) == "Done."


def test_the_agents_instructions_and_tools_are_kept_and_counted() -> None:
    """The agent's instructions go into L1's mutable part (the filter used to replace
    them), its tool definitions are counted in every request, and each request fits."""
    budget = Budget(context_window=2400, reserve_output=300)
    conv = Conversation("You answer from search results.", vault=VAULT, budget=budget)
    session = LaminaSession(conv)
    model = Styled("text+call")
    agent = Agent(name="notes", model=model, tools=[search], instructions="Cite your notes.")
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )
    asyncio.run(Runner.run(agent, "Question?", session=session, run_config=config))
    assert conv.system.mutable == "Cite your notes."
    defs = [{"name": search.name, "description": search.description,
             "parameters": search.params_json_schema}]  # fmt: skip
    added = tool_tokens(defs, "openai-responses", conv.counter)
    assert added > 20
    assert session.state.tools == defs  # for usage_record(tools=)
    assert session.state.agent is not None
    for loop in session.loops:
        assert "results.\n\nCite your notes." in loop.envelope.system_text
        steps = session.state.agent.loop_tokens(loop.steps)
        assert loop.tokens == budget.used(loop.envelope, conv.counter) + added + steps
        assert budget.effective(loop.tokens) <= budget.limit


TRIAGE = "Route each question to the right specialist."
RESEARCH = "Dig through the project notes with search, then answer citing them."
STABLE = "You answer from search results."


def _responses_model(bodies: list[dict[str, Any]]) -> OpenAIResponsesModel:
    """The SDK's own Responses model on an in-process transport: each request body is
    recorded as the SDK sends it. With no call yet, it hands off to the researcher; after
    the handoff it searches; after the search it answers (text with every call)."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = len(bodies)
        names = [i.get("name") for i in body["input"] if i.get("type") == "function_call"]
        text, call = f"Found it ({n}).", None
        if not names:
            text, call = "Passing you on.", ("transfer_to_researcher", {})
        elif "search" not in names:
            text, call = "Searching.", ("search", {"q": f"q{n}"})
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                 "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
        return httpx.Response(200, json=responses_reply(n, text, call, usage))

    client = AsyncOpenAI(
        api_key="offline", http_client=httpx.AsyncClient(transport=httpx.MockTransport(handle))
    )
    return OpenAIResponsesModel("gpt-4.1", openai_client=client)


def _triage(model: Any) -> Agent[Any]:
    """A triage agent (instructions A) that hands off to a researcher (instructions B)
    with a search tool: the SDK's headline pattern."""
    researcher = Agent(name="researcher", model=model, tools=[search], instructions=RESEARCH)
    return Agent(name="triage", model=model, handoffs=[researcher], instructions=TRIAGE)


def _runs(session: LaminaSession, agent: Agent[Any], questions: range) -> list[str]:
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )

    async def run() -> list[str]:
        out = []
        for i in questions:
            if i == 0:
                session.attach({"note": "project-spec.md"})
            result = await Runner.run(agent, f"Question {i}?", session=session, run_config=config)
            out.append(str(result.final_output))
        return out

    return asyncio.run(run())


def _wire_tokens(body: dict[str, Any], budget: Budget, counter: Any) -> int:
    """The Responses body as sent, counted item by item with the budget's framing, and its
    tool definitions (OpenAI's counting)."""
    framing = budget.framing
    total = framing.priming + framing.per_message + counter.count(body["instructions"])
    for item in body["input"]:
        if item.get("type") == "function_call":
            total += framing.tool_call + counter.count(item["name"] + item["arguments"])
        elif item.get("type") == "function_call_output":
            total += framing.per_message + counter.count(item["output"])
        else:
            total += framing.per_message + counter.count(str(item["content"]))
    tools = [
        {"name": t["name"], "description": t["description"], "parameters": t["parameters"]}
        for t in body.get("tools", [])
    ]
    return total + tool_tokens(tools, "openai-responses", counter)


@pytest.mark.parametrize("window", [2400, 8000])
def test_a_handoff_sends_the_new_agents_instructions_counted_and_reported(
    window: int, tmp_path: Path
) -> None:
    """Triage (instructions A) hands off to a researcher (B) that searches and answers,
    twice: each call carries its agent's instructions in L1's mutable part after the same
    stable part, the body the SDK sends is Lamina's count exactly and fits, and the
    handoff is a typed L1 decision the cache report and explain_cache name."""
    budget = Budget(context_window=window, reserve_output=300)
    conv = Conversation(STABLE, vault=VAULT, budget=budget)
    store = SqliteStore(tmp_path / "s.db")
    session = LaminaSession(conv, store, "conv-1")
    bodies: list[dict[str, Any]] = []
    outputs = _runs(session, _triage(_responses_model(bodies)), range(2))
    assert outputs == ["Found it (3).", "Found it (6)."]
    assert [(h.user, h.assistant) for h in conv.history] == [
        ("Question 0?", "Found it (3)."),
        ("Question 1?", "Found it (6)."),
    ]
    assert len(bodies) == len(session.loops) == 6
    head = f"{STABLE}\n\n"
    agents = [TRIAGE, RESEARCH, RESEARCH] * 2
    for body, loop, instructions in zip(bodies, session.loops, agents, strict=True):
        assert body["instructions"].startswith(head + instructions)
        assert body["instructions"] == loop.envelope.system_text
        assert body["input"] == agent_request(loop, "openai-responses").body["input"]
        assert _wire_tokens(body, budget, conv.counter) == loop.tokens
        assert budget.effective(loop.tokens) <= budget.limit
        check_envelope(loop.envelope)
    assert [[t["name"] for t in b["tools"]] for b in bodies] == [
        ["transfer_to_researcher"], ["search"], ["search"]
    ] * 2  # fmt: skip
    handoffs = [
        [d.action for d in loop.envelope.report.decisions if d.layer == "L1"]
        for loop in session.loops
    ]
    # Run 2's first call (triage again) after run 1's last (the researcher): a handoff
    # too, with its decision (it was memory-changed, which no decision explained).
    handed = [DecisionAction.HANDOFF]
    assert handoffs == [[], handed, handed, handed, handed * 2, handed * 2]
    envelopes = [loop.envelope for loop in session.loops]
    assert [classify_break(a, b) for a, b in itertools.pairwise(envelopes)] == [
        ("handoff",),
        (),
        ("handoff",),
        ("handoff",),
        (),
    ]
    for before, after in itertools.pairwise(envelopes):
        check_envelope(after, before)
    trace = annotate_trace(trace_document(envelopes, conv.counter), envelopes, conv.counter)
    assert [t["cache"]["break_reason"] for t in trace["turns"]] == [
        "first-turn", "handoff", None, "handoff", "handoff", None
    ]  # fmt: skip
    for n in (1, 3):
        assert "handed off to an agent with other instructions" in explain_cache(
            trace["turns"][n], trace["turns"][n - 1]
        )[0]
    if window == 8000:  # nothing cut: the bytes after L1's mutable part are the same
        assert not any(loop.decisions for loop in session.loops)
        assert bodies[4]["instructions"] == bodies[3]["instructions"].replace(TRIAGE, RESEARCH)
        assert "# Context Library" in bodies[4]["instructions"]
        check_envelope(envelopes[3], envelopes[0])  # the turns as built: no L1 change
    # The turn as built (saved) and the conversation keep the instructions the run
    # started with: the next run's triage agent finds them in place.
    assert conv.system == SystemPrompt(STABLE, TRIAGE)
    assert session.state.envelope is not None
    assert session.state.envelope.l1.get("system:mutable").text == TRIAGE  # type: ignore[union-attr]
    store.close()


def test_the_next_run_after_a_handoff_restores_byte_for_byte(tmp_path: Path) -> None:
    """Run 2 of a conversation loaded from the store (a new session) sends the bodies the
    uninterrupted session sent, call for call."""
    budget = Budget(context_window=2400, reserve_output=300)
    whole: list[dict[str, Any]] = []
    conv = Conversation(STABLE, vault=VAULT, budget=budget)
    _runs(LaminaSession(conv), _triage(_responses_model(whole)), range(2))
    store = SqliteStore(tmp_path / "s.db")
    parts: list[dict[str, Any]] = []
    agent = _triage(_responses_model(parts))
    first = Conversation(STABLE, vault=VAULT, budget=budget)
    _runs(LaminaSession(first, store, "c"), agent, range(1))
    loaded = load_conversation(store, "c", vault=VAULT)
    assert loaded.system == SystemPrompt(STABLE, TRIAGE)
    _runs(LaminaSession(loaded, store, "c"), agent, range(1, 2))
    assert len(parts) == len(whole) == 6
    for sent, expected in zip(parts, whole, strict=True):
        assert sent["instructions"] == expected["instructions"]
        assert sent["input"] == expected["input"]
    assert store.load("c") == conv.state
    store.close()


def test_a_loaded_sessions_first_request_after_a_handoff_is_explained(
    backend: Backend,
) -> None:
    """Run 1 (triage hands off to the researcher) is saved; run 2 in a session loaded from
    the store starts with triage again: its first request carries the ``handoff`` decision
    the uninterrupted session gives it (the researcher's instructions the last request
    sent are saved, ``agent_handoff``), so ``check_envelope`` holds across the two
    sessions. Before, the loaded session had no such decision and invariant 5 failed."""
    budget = Budget(context_window=8000, reserve_output=300)
    whole: list[dict[str, Any]] = []
    live = LaminaSession(Conversation(STABLE, vault=VAULT, budget=budget))
    _runs(live, _triage(_responses_model(whole)), range(2))
    parts: list[dict[str, Any]] = []
    agent = _triage(_responses_model(parts))
    with backend.open() as store:
        first = LaminaSession(Conversation(STABLE, vault=VAULT, budget=budget), store, "c")
        _runs(first, agent, range(1))
        assert store.load("c").agent_handoff == RESEARCH
        loaded = load_conversation(store, "c", vault=VAULT)
        assert loaded.agent_handoff == RESEARCH
        second = LaminaSession(loaded, store, "c")
        _runs(second, agent, range(1, 2))
        requests = [loop.envelope for loop in (*first.loops, *second.loops)]
        expected = [loop.envelope for loop in live.loops]
        assert len(requests) == len(expected) == len(parts) == 6
        assert [e.report.decisions for e in requests] == [e.report.decisions for e in expected]
        handed = [d.action for d in second.loops[0].envelope.report.decisions if d.layer == "L1"]
        assert handed == [DecisionAction.HANDOFF]
        for before, after in itertools.pairwise(requests):
            check_envelope(after, before)
        assert [b["instructions"] for b in parts] == [b["instructions"] for b in whole]
        assert store.load("c") == live.conversation.state
        assert store.load("c").agent_handoff == RESEARCH  # run 2 handed off too
    # A turn built without the adapter follows the handed request itself: the text is spent.
    plain = live.conversation
    plain.turn("A plain question?")
    assert plain.agent_handoff == ""


@pytest.mark.parametrize("then", ["triage", "researcher"])
def test_a_conversation_resumed_from_its_transcript_sends_the_same_requests(
    then: str, tmp_path: Path
) -> None:
    """Run 1 (triage hands off to the researcher) is exported as a markdown transcript and
    imported into another store; run 2 in a session on the imported conversation, with
    triage again or with the researcher alone, sends the requests the uninterrupted
    conversation sent, with the same decisions (the frontmatter carries ``agent_system``
    and ``agent_handoff``). Before, the researcher's run raised ConfigError (the imported
    mutable part read as the host's own) and triage's first request had no decision."""

    def next_agent(model: Any) -> Agent[Any]:
        if then == "triage":
            return _triage(model)
        return Agent(name="researcher", model=Scripted(), tools=[search], instructions=RESEARCH)

    live_model = _responses_model([])
    live = LaminaSession(Conversation(STABLE, vault=VAULT))
    _runs(live, _triage(live_model), range(1))
    _runs(live, next_agent(live_model), range(1, 2))
    model = _responses_model([])
    with SqliteStore(tmp_path / "a.db") as first, SqliteStore(tmp_path / "b.db") as second:
        _runs(LaminaSession(Conversation(STABLE, vault=VAULT), first, "c"), _triage(model),
              range(1))  # fmt: skip
        text = export_transcript(first, "c")
        assert f"agent_system: {TRIAGE}\n" in text
        assert f"agent_handoff: {RESEARCH}\n" in text
        assert import_transcript(text, second, vault=VAULT).problems == ()
        assert second.load("c") == first.load("c")
        resumed = LaminaSession(load_conversation(second, "c", vault=VAULT), second, "c")
        _runs(resumed, next_agent(model), range(1, 2))
    expected = live.loops[-len(resumed.loops) :]
    assert len(resumed.loops) == 3 if then == "triage" else len(resumed.loops) >= 2
    for got, want in zip(resumed.loops, expected, strict=True):
        assert got.envelope.report.decisions == want.envelope.report.decisions
        body = agent_request(got, "openai-responses").body
        assert body == agent_request(want, "openai-responses").body
    changed = [d.action for d in resumed.loops[0].envelope.report.decisions if d.layer == "L1"]
    want_first = DecisionAction.HANDOFF if then == "triage" else DecisionAction.SYSTEM_CHANGED
    assert changed == [want_first]


def test_a_handoff_never_replaces_a_mutable_part_the_host_set() -> None:
    """A triage agent without instructions leaves the host's memory in L1; a handoff to
    an agent with instructions would replace it, so it raises rather than lose either."""
    conv = Conversation(STABLE, vault=VAULT)
    conv.set_system(mutable="Memory: the user prefers short answers.")
    session = LaminaSession(conv)
    model = Triage()
    researcher = Agent(name="researcher", model=model, tools=[search], instructions="Dig.")
    triage = Agent(name="triage", model=model, handoffs=[researcher])
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )
    with pytest.raises(ConfigError, match="mutable part is the host's own"):
        asyncio.run(Runner.run(triage, "Question?", session=session, run_config=config))
    assert conv.system.mutable == "Memory: the user prefers short answers."


def test_instructions_never_replace_a_mutable_part_the_host_set() -> None:
    conv = Conversation("You answer from search results.", vault=VAULT)
    conv.set_system(mutable="Memory: the user prefers short answers.")
    session = LaminaSession(conv)
    agent = Agent(name="notes", model=Styled("call"), tools=[search], instructions="Be brief.")
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )
    with pytest.raises(ConfigError, match="mutable part is set too"):
        asyncio.run(Runner.run(agent, "Question?", session=session, run_config=config))
    assert conv.system.mutable == "Memory: the user prefers short answers."
    assert not conv.history
    conv.set_system(mutable="Be brief.")  # the same text: adopted as it is
    asyncio.run(Runner.run(agent, "Question?", session=session, run_config=config))
    assert [h.assistant for h in conv.history] == ["Answer 3."]


def test_nested_handoff_history_is_refused_by_name() -> None:
    """``nest_handoff_history=True`` folds the input into a summary at the handoff, which
    holds no user message: the error names the setting (Lamina builds the input itself)."""
    conv = Conversation(STABLE, vault=VAULT)
    session = LaminaSession(conv)
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter,
        tracing_disabled=True,
        nest_handoff_history=True,
    )
    agent = _triage(_responses_model([]))
    with pytest.raises(ConversationError, match="nest_handoff_history"):
        asyncio.run(Runner.run(agent, "Question?", session=session, run_config=config))


def test_a_loaded_conversation_goes_on_with_another_agent(backend: Backend) -> None:
    """A conversation saved after a run of one agent and loaded into a new session goes on
    with an agent with other instructions as the live conversation does (their L1 mutable
    part replaced, a system-changed decision), request for request, on either store."""
    budget = Budget(context_window=2400, reserve_output=300)

    def run(session: LaminaSession, instructions: str, model: Scripted, i: int) -> None:
        agent = Agent(name="a", model=model, tools=[search], instructions=instructions)
        config = RunConfig(
            call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
        )
        asyncio.run(Runner.run(agent, f"Question {i}?", session=session, run_config=config))

    live_model, parts_model = Scripted(), Scripted()
    live = Conversation(STABLE, vault=VAULT, budget=budget)
    session = LaminaSession(live)
    run(session, TRIAGE, live_model, 0)
    run(session, RESEARCH, live_model, 1)
    with backend.open() as store:
        first = Conversation(STABLE, vault=VAULT, budget=budget)
        run(LaminaSession(first, store, "c"), TRIAGE, parts_model, 0)
        loaded = load_conversation(store, "c", vault=VAULT)
        assert loaded.agent_system == TRIAGE
        resumed = LaminaSession(loaded, store, "c")
        run(resumed, RESEARCH, parts_model, 1)  # raised ConfigError before
        assert parts_model.received == live_model.received
        assert loaded.system == live.system == SystemPrompt(STABLE, RESEARCH)
        envelope = resumed.state.envelope
        assert envelope is not None
        changed = [d.action for d in envelope.report.decisions if d.layer == "L1"]
        assert changed == [DecisionAction.SYSTEM_CHANGED]
        assert store.load("c") == live.state
        again = load_conversation(store, "c", vault=VAULT)
        again.set_system(mutable="Memory: the user prefers short answers.")  # the host's own
        with pytest.raises(ConfigError, match="mutable part is set too"):
            run(LaminaSession(again), TRIAGE, Scripted(), 2)
        assert again.system.mutable == "Memory: the user prefers short answers."


def _search_twice(body: dict[str, Any], n: int) -> tuple[str, tuple[str, dict[str, Any]] | None]:
    """Searches twice (text with each call), then answers."""
    searches = sum(1 for i in body["input"] if i.get("type") == "function_call")
    if searches < 2:
        return f"Searching ({n}).", ("search", {"q": f"q{n}"})
    return f"Answer {n}.", None


def _hand_off_then_search(
    body: dict[str, Any], n: int
) -> tuple[str, tuple[str, dict[str, Any]] | None]:
    """Hands off to the researcher, which searches once, then answers."""
    names = [i.get("name") for i in body["input"] if i.get("type") == "function_call"]
    if not names:
        return "Passing you on.", ("transfer_to_researcher", {})
    if "search" not in names:
        return "Searching.", ("search", {"q": f"q{n}"})
    return f"Found it ({n}).", None


Reply = Callable[[dict[str, Any], int], tuple[str, tuple[str, dict[str, Any]] | None]]


def _billing_model(
    bodies: list[dict[str, Any]], budget: Budget, counter: Any, reply: Reply = _search_twice
) -> Any:
    """The SDK's Responses model on an in-process transport that bills like a provider
    with a prefix cache: input is the body as sent, counted item by item (``_wire_tokens``);
    cached is the leading run of tools, instructions and input items an earlier body
    shares whole, in 128-token steps from 1,024 (OpenAI's rules). The model answers as
    ``reply`` says."""
    framing = budget.framing

    def units(body: dict[str, Any]) -> list[tuple[str, int]]:
        tools = [{"name": t["name"], "description": t["description"],
                  "parameters": t["parameters"]} for t in body.get("tools", [])]  # fmt: skip
        out = [(json.dumps(tools), tool_tokens(tools, "openai-responses", counter))]
        system = body["instructions"]
        out.append((system, framing.per_message + counter.count(system)))
        for item in body["input"]:
            one = {**body, "instructions": "", "input": [item], "tools": []}
            out.append((json.dumps(item, sort_keys=True), _wire_tokens(one, budget, counter)
                        - framing.priming - framing.per_message))  # fmt: skip
        return out

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        cached = served_prefix(units(body), [units(b) for b in bodies])
        bodies.append(body)
        n = len(bodies)
        text, call = reply(body, n)
        usage = {"input_tokens": _wire_tokens(body, budget, counter), "output_tokens": 5,
                 "total_tokens": 0, "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
        return httpx.Response(200, json=responses_reply(n, text, call, usage))

    client = AsyncOpenAI(
        api_key="offline", http_client=httpx.AsyncClient(transport=httpx.MockTransport(handle))
    )
    return OpenAIResponsesModel("gpt-4.1", openai_client=client)


def test_each_call_of_an_agent_loop_has_its_own_usage_read_back(tmp_path: Path) -> None:
    """Two runs of three model calls through the SDK: each call's usage (the SDK's
    ``raw_responses``) is read back against that call's request (``session.loops[i]``):
    the predicted input is the provider's count exactly, the calls after the first predict
    the prefix the provider served, and every call is kept and saved (``TurnUsage.call``).
    Against the turn's envelope, as before, calls 2 and 3 were predicted short by their
    loop and a cache hit on the loop's own calls was never predicted."""
    budget = Budget(context_window=8000, reserve_output=300)
    conv = Conversation(STABLE, vault=VAULT, budget=budget)
    store = SqliteStore(tmp_path / "s.db")
    session = LaminaSession(conv, store, "c")
    bodies: list[dict[str, Any]] = []
    agent = Agent(name="notes", model=_billing_model(bodies, budget, conv.counter),
                  tools=[search], instructions="Cite your notes.")  # fmt: skip
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )

    async def run() -> list[Any]:
        responses = []
        for i in range(2):
            if i == 0:
                session.attach({"note": "project-spec.md"})
            result = await Runner.run(agent, f"Question {i}?", session=session, run_config=config)
            responses.extend(result.raw_responses)
        return responses

    responses = asyncio.run(run())
    assert len(responses) == len(session.loops) == 6
    records = []
    for n, response in enumerate(responses):
        usage = usage_record(
            session.loops[: n + 1], response.usage, "openai-responses", "gpt-4.1",
            tools=session.state.tools,
        )  # fmt: skip
        conv.record_usage(usage)
        records.append(usage)
    observed = [u.observed for u in records]
    assert [u.predicted_input for u in records] == [o.input_tokens for o in observed]
    assert [(u.turn, u.call) for u in records] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    assert [o.cached_tokens > 0 for o in observed] == [False, True, True, False, True, True]
    for u in (records[1], records[2], records[4], records[5]):
        assert u.predicted_cached == u.observed.cached_tokens
    assert all(u.warning is None for u in records)
    assert conv.usage == tuple(records)
    save_turn(store, "c", conv)  # the run saved its turn before the read-backs
    assert load_conversation(store, "c", vault=VAULT).usage == tuple(records)
    trace = trace_document([loop.envelope for loop in session.loops], conv.counter,
                           usage=conv.usage)  # fmt: skip
    assert [t["usage"]["call"] for t in trace["turns"]] == [1, 2, 3, 1, 2, 3]
    # A provider whose tokenizer is not local, billing each call 10% over the loop's own
    # count: calibration compares each call with its request (it learned 0.9, the cap,
    # from the turn's envelope against the loop's calls).
    for n, loop in enumerate(session.loops):
        billed = {"input_tokens": math.ceil(1.1 * loop.tokens) + ANTHROPIC_TOOL_PROMPT,
                  "output_tokens": 5}  # fmt: skip
        read = usage_record(
            session.loops[: n + 1], billed, "anthropic", "claude-sonnet-4-6",
            tools=session.state.tools,
        )  # fmt: skip
        conv.record_usage(read)
    calibration = conv.calibration("claude-sonnet-4-6")
    assert calibration is not None and calibration.samples == 6
    assert 0.05 <= calibration.margin <= 0.15
    store.close()


def test_interim_text_over_chat_completions_is_counted_as_its_own_message() -> None:
    """The SDK's Chat Completions model sends a step's interim text ("Let me search") and
    its call as two assistant messages: every body it sends, counted message by message,
    is Lamina's count of that call's loop (it counted one message: 3 tokens short per
    step with text), and Lamina's own chat rendering of the loop is that body."""
    bodies: list[dict[str, Any]] = []
    transport = httpx.MockTransport(recording_chat(bodies))
    client = AsyncOpenAI(api_key="offline", http_client=httpx.AsyncClient(transport=transport))
    model = OpenAIChatCompletionsModel("gpt-4.1", openai_client=client)
    budget = Budget(context_window=8000, reserve_output=300)
    conv = Conversation(STABLE, vault=VAULT, budget=budget)
    session = LaminaSession(conv)
    agent = Agent(name="notes", model=model, tools=[search], instructions="Cite your notes.")
    outputs = _runs(session, agent, range(2))
    assert outputs == ["Answer 3.", "Answer 6."]
    assert len(bodies) == len(session.loops) == 6
    for body, loop in zip(bodies, session.loops, strict=True):
        tools = [t["function"] for t in body.get("tools", [])]
        assert chat_tokens(body["messages"], tools, budget.framing, conv.counter) == loop.tokens
        assert body["messages"] == agent_request(loop, "openai").body["messages"]
    roles = [m["role"] for m in bodies[2]["messages"][-6:]]
    assert roles == ["assistant", "assistant", "tool"] * 2
    assert [s.text_apart for s in session.loops[2].steps] == [True, True]


def test_the_first_call_after_a_handoff_predicts_what_that_agent_left_cached() -> None:
    """Triage hands off to a researcher with long instructions in each of three runs: the
    researcher's first call of runs 2 and 3 is served the prefix its calls of the run
    before left cached (its tools and instructions), which the triage call just before
    it does not share (other tools, other instructions after a short stable part); the
    first handoff is served nothing (the tools lead the prefix). Each call's predicted
    cached tokens is what the provider served (before: 0 on the researcher's first calls
    of runs 2 and 3, where 1,920 were served)."""
    budget = Budget(context_window=8000, reserve_output=300)
    conv = Conversation(STABLE, vault=VAULT, budget=budget)
    session = LaminaSession(conv)
    bodies: list[dict[str, Any]] = []
    model = _billing_model(bodies, budget, conv.counter, _hand_off_then_search)
    long = "\n".join(f"Rule {i}: cite the note and the section you used." for i in range(150))
    researcher = Agent(name="researcher", model=model, tools=[search],
                       instructions=f"{RESEARCH}\n{long}")  # fmt: skip
    triage = Agent(name="triage", model=model, handoffs=[researcher], instructions=TRIAGE)
    config = RunConfig(
        call_model_input_filter=session.call_model_input_filter, tracing_disabled=True
    )

    async def run() -> list[Any]:
        responses = []
        for i in range(3):
            result = await Runner.run(triage, f"Question {i}?", session=session, run_config=config)
            responses.extend(result.raw_responses)
        return responses

    responses = asyncio.run(run())
    assert len(responses) == len(session.loops) == 9
    records = [
        usage_record(session.loops[: n + 1], r.usage, "openai-responses", "gpt-4.1",
                     sent=bodies[n])
        for n, r in enumerate(responses)
    ]  # fmt: skip
    served = [u.observed.cached_tokens for u in records]
    assert served[4] > 0 and served[7] > 0  # the researcher's first call, runs 2 and 3
    assert [u.predicted_cached for u in records] == served
    assert all(u.warning is None for u in records)
