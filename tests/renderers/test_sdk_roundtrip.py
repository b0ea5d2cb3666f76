"""Lamina's requests sent by the official SDKs to a local server: same body, parsed reply."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from lamina import Conversation
from lamina.pipeline import SystemPrompt
from lamina.pipeline._tokens.profiles import get_profile
from lamina.renderers import RenderedRequest, gemini_cache_plan, render_request, request_options
from lamina.renderers._layouts import build_prompt

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
genai = pytest.importorskip("google.genai")

OPENAI_CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4.1",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok chat"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
}
OPENAI_RESPONSES = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-4.1",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok responses", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12,
    },
}
ANTHROPIC = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "ok claude"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_input_tokens": 0},
}
GEMINI = {
    "candidates": [
        {"content": {"role": "model", "parts": [{"text": "ok gemini"}]}, "finishReason": "STOP"}
    ],
    "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 2, "totalTokenCount": 12},
}
GEMINI_CACHE = {"name": "cachedContents/abc123", "model": "models/gemini-2.5-flash"}


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, Any]]

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append((self.path, json.loads(raw)))
        if self.path.endswith("/chat/completions"):
            reply: dict[str, Any] = OPENAI_CHAT
        elif self.path.endswith("/responses"):
            reply = OPENAI_RESPONSES
        elif self.path.endswith("/messages"):
            reply = ANTHROPIC
        elif self.path.endswith("/cachedContents"):
            reply = GEMINI_CACHE
        else:
            reply = GEMINI
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    seen: list[tuple[str, Any]] = []
    handler = type("H", (_Recorder,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", seen
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def envelopes() -> list[Any]:
    vault = Path(__file__).resolve().parents[2] / "examples" / "vault"
    conv = Conversation(  # the library grown every turn: the system is worth caching
        SystemPrompt("You answer from context.", "Memory: short answers."),
        vault=vault,
        defer_library=False,
    )
    envs = [conv.turn("Summarize this", [{"note": "project-spec.md"}])]
    conv.reply("A spec.")
    envs.append(
        conv.turn("And the API?", [{"note": "docs/api-docs.md"}, {"note": "project-spec.md"}])
    )
    conv.reply("Endpoints.")
    envs.append(conv.turn("Auth?", [{"note": "project-spec.md"}]))
    return envs


@pytest.mark.parametrize("layout", ["default", "append-only", "naive"])
def test_openai_chat_sdk_sends_the_rendered_body(server: Any, envelopes: Any, layout: Any) -> None:
    base, seen = server
    req = render_request(envelopes, "openai", layout=layout, conversation_id="c-1", max_tokens=64)
    client = openai.OpenAI(api_key="test", base_url=f"{base}/v1", max_retries=0)
    reply = client.chat.completions.create(**req.body)
    assert seen == [("/v1/chat/completions", req.body)]
    assert reply.choices[0].message.content == "ok chat"


def test_openai_responses_sdk_sends_the_rendered_body(server: Any, envelopes: Any) -> None:
    base, seen = server
    req = render_request(envelopes, "openai-responses", conversation_id="c-1")
    client = openai.OpenAI(api_key="test", base_url=f"{base}/v1", max_retries=0)
    reply = client.responses.create(**req.body)
    assert seen == [("/v1/responses", req.body)]
    assert reply.output_text == "ok responses"


@pytest.mark.parametrize("layout", ["default", "append-only"])
def test_anthropic_sdk_sends_the_rendered_body(server: Any, envelopes: Any, layout: Any) -> None:
    base, seen = server
    req = render_request(envelopes, "anthropic", layout=layout, ttl="1h")
    client = anthropic.Anthropic(api_key="test", base_url=base, max_retries=0)
    reply = client.messages.create(**req.body)
    assert seen == [("/v1/messages", req.body)]
    assert reply.content[0].text == "ok claude"


def _gemini_client(base: str) -> Any:
    return genai.Client(
        api_key="test",
        http_options=genai.types.HttpOptions(base_url=base, api_version="v1beta"),
    )


def _gemini_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if "systemInstruction" in body:
        config["system_instruction"] = body["systemInstruction"]
    if "cachedContent" in body:
        config["cached_content"] = body["cachedContent"]
    if "maxOutputTokens" in body["generationConfig"]:
        config["max_output_tokens"] = body["generationConfig"]["maxOutputTokens"]
    return config


@pytest.mark.parametrize("max_tokens", [None, 128])
def test_gemini_sdk_sends_the_rendered_body(server: Any, envelopes: Any, max_tokens: Any) -> None:
    base, seen = server
    req = render_request(envelopes, "gemini", max_tokens=max_tokens)
    client = _gemini_client(base)
    reply = client.models.generate_content(
        model="gemini-2.5-flash", contents=req.body["contents"], config=_gemini_config(req.body)
    )
    assert seen == [(req.path, req.body)]
    assert reply.text == "ok gemini"


def test_gemini_sdk_sends_the_explicit_cache_plan(server: Any, envelopes: Any) -> None:
    base, seen = server
    options = request_options(
        "gemini", profile=get_profile("gemini-2.5-flash", min_cacheable_tokens=500)
    )
    plan = gemini_cache_plan(build_prompt(envelopes), options, cache_name="cachedContents/abc123")
    assert isinstance(plan.create, RenderedRequest)
    client = _gemini_client(base)
    created = client.caches.create(
        model=plan.create.body["model"],
        config={
            "display_name": plan.create.body["displayName"],
            "system_instruction": plan.create.body["systemInstruction"],
            "ttl": plan.create.body["ttl"],
        },
    )
    assert created.name == "cachedContents/abc123"
    reply = client.models.generate_content(
        model="gemini-2.5-flash",
        contents=plan.request.body["contents"],
        config=_gemini_config(plan.request.body),
    )
    assert seen == [(plan.create.path, plan.create.body), (plan.request.path, plan.request.body)]
    assert "systemInstruction" not in plan.request.body
    assert reply.text == "ok gemini"
