"""LiteLLM pass-through: Lamina's messages reach the provider body with cache_control kept."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm

from lamina import Conversation
from lamina.adapters.litellm import completion, to_messages
from lamina.pipeline.agent import AgentTurn, agent_call
from lamina.pipeline.tokens import Usage, read_usage
from lamina.renderers import agent_request, render_request

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"
RULES = "\n".join(f"Rule {i}: cite the note and the section you used." for i in range(400))


def _anthropic_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The Messages API body LiteLLM makes of these messages (its own transformation)."""
    body: dict[str, Any] = litellm.AnthropicConfig().transform_request(
        model="claude-sonnet-4-6",
        messages=messages,  # type: ignore[arg-type]
        optional_params={},
        litellm_params={},
        headers={},
    )
    return body


def test_anthropic_body_keeps_lamina_blocks_and_breakpoints() -> None:
    conv = Conversation(RULES, vault=VAULT)
    env = conv.turn("Summarize", [{"note": "project-spec.md"}])
    messages = to_messages(env, "anthropic/claude-sonnet-4-6")
    body = _anthropic_body(messages)
    mine = render_request(env, "anthropic", "claude-sonnet-4-6").body
    assert body["system"] == mine["system"]
    assert body["messages"] == mine["messages"]
    assert any("cache_control" in block for block in body["system"])


def test_openai_models_get_plain_messages() -> None:
    conv = Conversation(RULES, vault=VAULT)
    env = conv.turn("Summarize", [{"note": "project-spec.md"}])
    assert to_messages(env, "gpt-4.1") == render_request(env, "openai").body["messages"]


def test_completion_with_mock_response_and_its_usage() -> None:
    conv = Conversation(RULES, vault=VAULT)
    env = conv.turn("Summarize", [{"note": "project-spec.md"}])
    response = completion(env, "anthropic/claude-sonnet-4-6", mock_response="A spec.")
    assert response.choices[0].message.content == "A spec."
    usage = read_usage(response)
    assert usage == Usage(
        response.usage.prompt_tokens, 0, 0, response.usage.completion_tokens, "openai"
    )


def test_a_tool_loop_through_litellm_keeps_lamina_blocks_and_pairs_each_call() -> None:
    conv = Conversation(RULES, vault=VAULT)
    agent = AgentTurn.start(conv, "How do tokens expire?", [{"note": "project-spec.md"}])
    call = {
        "id": "toolu_01",
        "type": "function",
        "function": {"name": "read_note", "arguments": json.dumps({"path": "docs/auth.md"})},
    }
    first = completion(agent, "anthropic/claude-sonnet-4-6", mock_tool_calls=[call])
    (asked,) = first.choices[0].message.tool_calls
    result = (VAULT / "docs" / "auth.md").read_text(encoding="utf-8")
    args = json.loads(asked.function.arguments)
    agent = agent.step(agent_call(asked.function.name, args, result, id=asked.id))
    messages = to_messages(agent, "anthropic/claude-sonnet-4-6")
    body = _anthropic_body(messages)
    mine = agent_request(agent, "anthropic", "claude-sonnet-4-6").body
    assert body["system"] == mine["system"]
    assert any("cache_control" in block for block in body["system"])
    assert body["messages"][: len(mine["messages"]) - 2] == mine["messages"][:-2]
    assert body["messages"][-1] == mine["messages"][-1]  # with the loop's breakpoint
    assert "cache_control" in body["messages"][-1]["content"][-1]
    assert 1 <= json.dumps(body).count("cache_control") <= 4
    tool_use = body["messages"][-2]["content"][-1]
    tool_result = body["messages"][-1]["content"][0]
    assert (tool_use["type"], tool_use["id"], tool_use["name"], tool_use["input"]) == (
        "tool_use", "toolu_01", "read_note", {"path": "docs/auth.md"}
    )
    assert (tool_result["type"], tool_result["tool_use_id"]) == ("tool_result", "toolu_01")
    assert tool_result["content"] == mine["messages"][-1]["content"][0]["content"]
    assert "Fieldbook uses OAuth 2.0" in tool_result["content"]
    final = completion(agent, "anthropic/claude-sonnet-4-6", mock_response="After one hour.")
    agent.finish(conv, final.choices[0].message.content)
    assert conv.history[-1].assistant == "After one hour."


def test_tools_are_counted_with_the_calls_tool_choice_and_model() -> None:
    """LiteLLM takes OpenAI's tool_choice and maps it for Anthropic ("required" is any):
    the tool prompt counted follows it and the model (Haiku 3.5: 264 auto, 340 any)."""
    from lamina.adapters.litellm import with_tools
    from lamina.renderers import tool_tokens

    conv = Conversation(RULES, vault=VAULT)
    agent = AgentTurn.start(conv, "How do tokens expire?")
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    function = {"name": "read_note", "description": "Read a note.", "parameters": schema}
    tools = [{"type": "function", "function": function}]
    model = "anthropic/claude-3-5-haiku-20241022"
    auto = with_tools(agent, model, tools=tools)
    forced = with_tools(agent, model, tools=tools, tool_choice="required")
    assert isinstance(auto, AgentTurn) and isinstance(forced, AgentTurn)
    assert forced.tools_tokens - auto.tools_tokens == 340 - 264
    assert auto.tools_tokens == tool_tokens(
        [function], "anthropic", conv.counter, model="claude-3-5-haiku-20241022"
    )
    openai = with_tools(agent, "gpt-4.1", tools=tools, tool_choice="required")
    assert isinstance(openai, AgentTurn)
    assert openai.tools_tokens == tool_tokens([function], "openai", conv.counter)
    assert with_tools(agent, model) is agent
