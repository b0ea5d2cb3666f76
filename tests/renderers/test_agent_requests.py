"""Agent-loop requests in every format: no call without its result, no result without its call."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from lamina import Conversation
from lamina.pipeline import Budget
from lamina.pipeline._conversation.agent import AgentTurn, agent_call
from lamina.pipeline.errors import BudgetExceeded
from lamina.renderers._agent import agent_request
from tests.conftest import write_vault

pytest.importorskip("anthropic")
pytest.importorskip("openai")
genai_types = pytest.importorskip("google.genai.types")

from anthropic.types import MessageParam  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402
from openai.types.responses import ResponseInputParam  # noqa: E402

OPENAI_MESSAGES = TypeAdapter(list[ChatCompletionMessageParam])
RESPONSES_INPUT = TypeAdapter(ResponseInputParam)
ANTHROPIC_MESSAGES = TypeAdapter(list[MessageParam])


def _pairs_openai(messages: list[dict[str, Any]]) -> None:
    pending: set[str] = set()
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            assert not pending, "a call message came before the last one's results"
            pending = {c["id"] for c in m["tool_calls"]}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in pending, "a result whose call is missing"
            pending.discard(m["tool_call_id"])
        else:
            assert not pending, "a call without its result"
    assert not pending, "a call without its result"


def _pairs_responses(items: list[dict[str, Any]]) -> None:
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert sorted(calls) == sorted(outputs) and len(set(calls)) == len(calls)
    for cid in calls:
        c = next(k for k, i in enumerate(items) if i.get("call_id") == cid)
        o = max(k for k, i in enumerate(items) if i.get("call_id") == cid)
        assert c < o


def _pairs_anthropic(messages: list[dict[str, Any]]) -> None:
    roles = [m["role"] for m in messages]
    assert all(a != b for a, b in itertools.pairwise(roles)), "roles must alternate"
    for k, m in enumerate(messages):
        blocks = m["content"] if isinstance(m["content"], list) else []
        uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if uses:
            nxt = messages[k + 1]["content"]
            assert {b["tool_use_id"] for b in nxt if b.get("type") == "tool_result"} == uses
        if results:
            prev = messages[k - 1]["content"]
            assert {b["id"] for b in prev if b.get("type") == "tool_use"} == results


def _pairs_gemini(contents: list[dict[str, Any]]) -> None:
    for k, c in enumerate(contents):
        genai_types.Content.model_validate(c)
        calls = [p["functionCall"]["id"] for p in c["parts"] if "functionCall" in p]
        responses = [p["functionResponse"]["id"] for p in c["parts"] if "functionResponse" in p]
        if calls:
            nxt = contents[k + 1]["parts"]
            assert [p["functionResponse"]["id"] for p in nxt if "functionResponse" in p] == calls
        if responses:
            prev = contents[k - 1]["parts"]
            assert [p["functionCall"]["id"] for p in prev if "functionCall" in p] == responses


def check_all_formats(agent: AgentTurn) -> None:
    """Render the loop in every format, validate with the SDK types and check pairing."""
    loop = agent.fit()
    chat = agent_request(loop, "openai").body["messages"]
    OPENAI_MESSAGES.validate_python(chat)
    _pairs_openai(chat)
    items = agent_request(loop, "openai-responses").body["input"]
    RESPONSES_INPUT.validate_python(items)
    _pairs_responses(items)
    messages = agent_request(loop, "anthropic").body["messages"]
    ANTHROPIC_MESSAGES.validate_python(messages)
    _pairs_anthropic(messages)
    _pairs_gemini(agent_request(loop, "gemini").body["contents"])
    n = sum(len(s.calls) for s in agent.steps)
    assert sum(len(s.calls) for s in loop.steps) == n


_calls = st.lists(
    st.tuples(
        st.sampled_from(["search", "read_note", "fetch"]),
        st.integers(0, 5),
        st.integers(0, 400),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
)


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_vault(tmp_path_factory.mktemp("v"), {"a.md": "# A\n\nAlpha note.\n"})


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(_calls, min_size=1, max_size=8), window=st.integers(300, 12000))
def test_random_loops_never_split_a_call_from_its_result(
    vault: Path, steps: list[list[tuple[str, int, int, bool]]], window: int
) -> None:
    budget = Budget(context_window=window, reserve_output=min(200, window - 1))
    conv = Conversation("Agent.", vault=vault)
    agent = AgentTurn.start(
        conv, "Where is alpha?", [{"note": "a.md"}], budget=budget, repeat_after_tokens=300
    )
    for calls in steps:
        agent = agent.step(
            *(
                agent_call(name, {"q": q}, " ".join(["word"] * size), recoverable=rec)
                for name, q, size, rec in calls
            )
        )
    try:
        loop = agent.fit()
    except BudgetExceeded as err:
        assert err.report is not None
        return
    assert loop.tokens <= budget.limit
    check_all_formats(agent)


def test_a_known_loop_renders_in_every_format(vault: Path) -> None:
    conv = Conversation("Agent.", vault=vault)
    agent = AgentTurn.start(conv, "Q?").step(
        agent_call("search", {"q": "alpha"}, "hit"),
        agent_call("read_note", {"p": "a.md"}, "A"),
        text="Looking.",
    )
    check_all_formats(agent)
    body = agent_request(agent, "openai").body
    assert body["messages"][-3]["tool_calls"][0]["function"] == {
        "name": "search",
        "arguments": '{"q":"alpha"}',
    }
    assert body["messages"][-1] == {"role": "tool", "tool_call_id": "call_1_2", "content": "A"}


def test_tool_definitions_are_counted_per_provider() -> None:
    """OpenAI's published counting of function definitions; Anthropic's tool-use system
    prompt on top of the definitions as sent; no tools, no tokens."""
    from lamina.pipeline.tokens import TokenCounter
    from lamina.renderers import ANTHROPIC_TOOL_PROMPT, tool_tokens

    counter = TokenCounter("o200k_base")
    search = {
        "name": "search",
        "description": "Search the project notes.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    line, prop = counter.count("search:Search the project notes"), counter.count("q:string:")
    assert tool_tokens([search], "openai", counter) == 7 + line + 3 + 3 + prop + 12
    assert tool_tokens([search], "openai-responses", counter) == 7 + line + 3 + 3 + prop + 12
    mode = {**search, "parameters": {"properties": {"m": {"type": "string", "enum": ["a", "b"]}}}}
    enum = 3 + 3 - 3 + 2 * 3 + counter.count("a") + counter.count("b")
    key = counter.count("m:string:")
    assert tool_tokens([mode], "openai", counter) == 7 + line + enum + key + 12
    anthropic = tool_tokens([search], "anthropic", counter)
    assert anthropic > ANTHROPIC_TOOL_PROMPT == 346
    assert tool_tokens([], "anthropic", counter) == tool_tokens([], "openai", counter) == 0


@pytest.mark.parametrize(
    ("model", "choice", "tokens"),
    [
        (None, None, 346),
        ("claude-sonnet-4-6", "auto", 346),
        ("claude-opus-4-1-20250805", "none", 346),
        ("claude-sonnet-4-5", {"type": "any"}, 313),
        ("claude-haiku-4-5", {"type": "tool", "name": "search"}, 313),
        ("claude-3-7-sonnet-20250219", "any", 313),
        ("claude-3-5-haiku-20241022", "auto", 264),
        ("claude-3-5-haiku-20241022", "any", 340),
        ("anthropic.claude-3-opus-20240229-v1:0", None, 530),
        ("anthropic/claude-3-opus", "tool", 281),
        ("claude-3-sonnet-20240229", "auto", 159),
        ("claude-3-sonnet-20240229", "required", 235),
        ("claude-3-haiku-20240307", {"type": "function", "function": {"name": "s"}}, 340),
    ],
)
def test_anthropics_tool_prompt_follows_the_model_and_tool_choice(
    model: str | None, choice: object, tokens: int
) -> None:
    """Anthropic's published tool-use system prompt sizes, per model and tool_choice (auto
    or none; any or tool; OpenAI's names as LiteLLM passes them), in the tool count too."""
    from lamina.pipeline.tokens import TokenCounter
    from lamina.renderers import anthropic_tool_prompt, tool_tokens

    assert anthropic_tool_prompt(model, choice) == tokens
    counter = TokenCounter("o200k_base")
    search = {"name": "search", "description": "Search.", "parameters": {"type": "object"}}
    definitions = tool_tokens([search], "gemini", counter)
    assert tool_tokens(
        [search], "anthropic", counter, tool_choice=choice, model=model
    ) == tokens + definitions


def test_an_unknown_tool_choice_is_refused_by_name() -> None:
    from lamina.pipeline.errors import ConfigError
    from lamina.renderers import anthropic_tool_prompt

    with pytest.raises(ConfigError, match="unknown tool_choice 'sometimes'"):
        anthropic_tool_prompt("claude-sonnet-4-6", "sometimes")
