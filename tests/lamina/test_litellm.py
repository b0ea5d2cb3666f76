"""LiteLLM pass-through: Lamina's messages reach the provider body with cache_control kept."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm

from lamina import Conversation
from lamina.adapters.litellm import completion, to_messages
from pipeline import Usage, read_usage
from renderers import render_request

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"
RULES = "\n".join(f"Rule {i}: cite the note and the section you used." for i in range(400))


def test_anthropic_body_keeps_lamina_blocks_and_breakpoints() -> None:
    conv = Conversation(RULES, vault=VAULT)
    env = conv.turn("Summarize", [{"note": "project-spec.md"}])
    messages = to_messages(env, "anthropic/claude-sonnet-4-6")
    body = litellm.AnthropicConfig().transform_request(
        model="claude-sonnet-4-6",
        messages=messages,
        optional_params={},
        litellm_params={},
        headers={},
    )
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
