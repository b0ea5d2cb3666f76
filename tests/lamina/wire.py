"""Helpers for the adapter tests' in-process model transports: a Responses API reply, a
chat model's search-then-answer step, and the cached prefix an OpenAI-style provider
serves."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import httpx

Units = Sequence[tuple[str, int]]
"""A request body as the provider bills it: its pieces (tools, instructions, each input
item or message) with their tokens."""


def served_prefix(mine: Units, earlier: Sequence[Units]) -> int:
    """The tokens an OpenAI-style prefix cache serves for ``mine``: the longest leading run
    of pieces an earlier body shares whole, in 128-token steps from 1,024."""
    shared = 0
    for before in earlier:
        run = 0
        for (a, tokens), (b, _) in zip(mine, before, strict=False):
            if a != b:
                break
            run += tokens
        shared = max(shared, run)
    return shared - shared % 128 if shared >= 1024 else 0


def responses_reply(
    n: int, text: str, call: tuple[str, dict[str, Any]] | None, usage: dict[str, Any]
) -> dict[str, Any]:
    """The Responses API's reply ``n``: a message with ``text`` and, when given, a function
    call (name, arguments)."""
    content = [{"type": "output_text", "text": text, "annotations": []}]
    output: list[dict[str, Any]] = [
        {"type": "message", "id": f"m{n}", "role": "assistant", "status": "completed",
         "content": content}
    ]  # fmt: skip
    if call is not None:
        output.append(
            {"type": "function_call", "id": f"f{n}", "call_id": f"c{n}", "name": call[0],
             "arguments": json.dumps(call[1]), "status": "completed"}
        )  # fmt: skip
    return {"id": f"r{n}", "object": "response", "created_at": 0, "model": "gpt-4.1",
            "status": "completed", "output": output, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "usage": usage}  # fmt: skip


def chat_reply(n: int, message: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's chat completion ``n`` holding ``message``."""
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    reply = {"id": f"r{n}", "object": "chat.completion", "created": 0, "model": "gpt-4o"}
    return {**reply, "choices": [choice], "usage": usage}


def recording_chat(bodies: list[dict[str, Any]]) -> Callable[[httpx.Request], httpx.Response]:
    """An in-process OpenAI chat endpoint: each request body is kept in ``bodies``; the
    reply is ``search_or_answer``'s."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = len(bodies)
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return httpx.Response(200, json=chat_reply(n, search_or_answer(body, n), usage))

    return handle


def search_or_answer(body: dict[str, Any], n: int) -> dict[str, Any]:
    """A chat model's assistant message ``n``: a search call until the body holds two,
    then the answer (text with each)."""
    if sum(1 for m in body["messages"] if m.get("tool_calls")) < 2:
        call = {"name": "search", "arguments": json.dumps({"q": f"r{n}"})}
        return {
            "role": "assistant",
            "content": f"Let me search ({n}).",
            "tool_calls": [{"id": f"c{n}", "type": "function", "function": call}],
        }
    return {"role": "assistant", "content": f"Answer {n}."}


def chat_tokens(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], framing: Any, counter: Any
) -> int:
    """An OpenAI chat body as sent, counted message by message with ``framing`` (a
    message's framing and content; a tool call's framing, name and arguments text as
    sent) plus its tool definitions (OpenAI's counting)."""
    from lamina.renderers import tool_tokens

    total = framing.priming
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else ""
        total += framing.per_message + counter.count(text)
        for c in m.get("tool_calls") or ():
            total += framing.tool_call + counter.count(
                c["function"]["name"] + c["function"]["arguments"]
            )
    return total + tool_tokens(list(tools), "openai", counter)


def anthropic_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """An Anthropic body's blocks in request order: the system's, then each message's."""
    system = body.get("system") or []
    return [*system, *(b for m in body["messages"] for b in m["content"])]


def anthropic_served(
    body: dict[str, Any], earlier: Sequence[dict[str, Any]], counter: Any, least: int = 1024
) -> int:
    """The tokens Anthropic serves from its cache for ``body``: the longest prefix, up to a
    block boundary within 20 blocks before one of its breakpoints, that an earlier body
    wrote (its own prefix up to one of its breakpoints, of at least ``least`` tokens).
    Blocks are counted by their text (a ``tool_use`` by name and input)."""

    def plain(block: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True)

    def text(block: dict[str, Any]) -> str:
        if block.get("type") == "tool_use":
            return str(block["name"]) + json.dumps(block["input"])
        content = block.get("content", block.get("text", ""))
        return content if isinstance(content, str) else "".join(map(text, content))

    def prefixes(blocks: list[dict[str, Any]]) -> list[tuple[str, int]]:
        out, key, tokens = [], "", 0
        for block in blocks:
            key += plain(block)
            tokens += counter.count(text(block))
            out.append((key, tokens))
        return out

    written = set()
    for before in earlier:
        blocks = anthropic_blocks(before)
        for i, (key, tokens) in enumerate(prefixes(blocks)):
            if "cache_control" in blocks[i] and tokens >= least:
                written.add(key)
    blocks = anthropic_blocks(body)
    mine = prefixes(blocks)
    served = 0
    for i, block in enumerate(blocks):
        if "cache_control" in block:
            for key, tokens in mine[max(0, i - 20) : i + 1]:
                if key in written:
                    served = max(served, tokens)
    return served
