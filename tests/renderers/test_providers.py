"""Provider requests: byte stability, Anthropic breakpoints, Gemini cache plans, registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina import Conversation
from lamina.pipeline import Envelope, SystemPrompt
from lamina.pipeline._tokens.profiles import get_profile
from lamina.pipeline.errors import RegistryError
from lamina.pipeline.tokens import TokenCounter
from lamina.renderers import (
    RenderedRequest,
    RequestOptions,
    RequestRegistry,
    anthropic_breakpoints,
    build_prompt,
    gemini_cache_plan,
    render_request,
    request_options,
)
from lamina.renderers._layouts import Prompt
from lamina.renderers._providers import flat_blocks

VAULT = Path(__file__).resolve().parents[2] / "examples" / "vault"
NOTES = (
    "project-spec.md",
    "docs/api-docs.md",
    "docs/auth.md",
    "glossary.md",
    "meetings/2026-11-02.md",
)
SYSTEM = SystemPrompt("You answer from the attached context.", "Memory: short answers.")


def _run(plan: list[list[str]], defer: bool = False) -> list[Envelope]:
    """The plan's envelopes; the library grown every turn unless ``defer`` (most tests here
    check how the library layout is rendered)."""
    conv = Conversation(SYSTEM, vault=VAULT, defer_library=defer)
    envs: list[Envelope] = []
    for i, notes in enumerate(plan):
        envs.append(conv.turn(f"Question {i}", [{"note": n} for n in notes]))
        conv.reply(f"Answer {i}.")
    return envs


@pytest.fixture(scope="module")
def three() -> list[Envelope]:
    return _run([["project-spec.md"], ["docs/api-docs.md", "project-spec.md"], ["glossary.md"]])


@pytest.mark.parametrize("name", ["openai", "openai-responses", "anthropic", "gemini"])
def test_rendering_twice_gives_the_same_bytes(three: list[Envelope], name: str) -> None:
    a = render_request(three, name, conversation_id="c")
    b = render_request(
        _run([["project-spec.md"], ["docs/api-docs.md", "project-spec.md"], ["glossary.md"]]),
        name,
        conversation_id="c",
    )
    assert json.dumps(a.body, sort_keys=True) == json.dumps(b.body, sort_keys=True)


def test_openai_chat_messages_equal_the_envelope_texts(three: list[Envelope]) -> None:
    body = render_request(three[-1], "openai").body
    assert body["messages"][0] == {"role": "system", "content": three[-1].system_text}
    assert body["messages"][-1] == {"role": "user", "content": three[-1].user_text}


def test_a_deferred_library_is_rendered_as_sent() -> None:
    """The default conversation defers the library's growth: the request holds the
    settled library and each turn's context in the user message that sent it."""
    envs = _run([["project-spec.md"], ["docs/api-docs.md", "project-spec.md"]], defer=True)
    env, sent = envs[-1], envs[-1].as_sent()
    body = render_request(env, "openai").body
    assert body["messages"][0] == {"role": "system", "content": sent.system_text}
    assert sent.system_text == env.l1.text and env.l2.segments
    assert body["messages"][1]["content"] == envs[0].user_text
    assert body["messages"][-1] == {"role": "user", "content": sent.user_text}
    anthropic = render_request(env, "anthropic", model="claude-sonnet-4-5").body
    assert "cache_control" in anthropic["messages"][-1]["content"][-1]


def test_prompt_cache_key_is_stable_and_hides_the_conversation_id(three: list[Envelope]) -> None:
    a = render_request(three[0], "openai", conversation_id="user-42/chat-7").body
    b = render_request(three[-1], "openai", conversation_id="user-42/chat-7").body
    assert a["prompt_cache_key"] == b["prompt_cache_key"]
    assert "user-42" not in a["prompt_cache_key"]
    assert "prompt_cache_key" not in render_request(three[0], "openai").body


def test_responses_request_puts_system_text_in_instructions(three: list[Envelope]) -> None:
    body = render_request(three[-1], "openai-responses").body
    assert body["instructions"] == three[-1].system_text
    assert body["input"][-1] == {"role": "user", "content": three[-1].user_text}


def test_anthropic_system_has_one_block_per_l2_entry(three: list[Envelope]) -> None:
    env = three[-1]
    body = render_request(env, "anthropic").body
    texts = [b["text"] for b in body["system"]]
    assert texts[:2] == [s.text for s in env.l1.segments]
    assert texts[3:] == [s.text for s in env.l2.segments]
    assert len(env.l2.segments) == 2


def test_anthropic_breakpoints_sit_at_l2_end_and_history_end(three: list[Envelope]) -> None:
    body = render_request(three[-1], "anthropic", model="claude-sonnet-4-5").body
    marked = [b for b in body["system"] if "cache_control" in b]
    assert marked == [body["system"][-1]]
    assert "cache_control" in body["messages"][-2]["content"][-1]
    assert "cache_control" not in body["messages"][-1]["content"][-1]
    assert marked[0]["cache_control"] == {"type": "ephemeral"}


def test_anthropic_one_hour_ttl(three: list[Envelope]) -> None:
    body = render_request(three[-1], "anthropic", model="claude-sonnet-4-5", ttl="1h").body
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_no_breakpoint_below_the_model_minimum(three: list[Envelope]) -> None:
    """Turn 1's system (L1 only) is far below 1,024 tokens: nothing is marked."""
    body = render_request(three[0], "anthropic", model="claude-sonnet-4-5").body
    assert not any("cache_control" in b for b in body["system"])


def test_append_only_marks_the_end_of_this_turn(three: list[Envelope]) -> None:
    body = render_request(three, "anthropic", model="claude-sonnet-4-5", layout="append-only").body
    assert "cache_control" in body["messages"][-1]["content"][-1]


def _prefix_tokens(prompt: Prompt, counter: TokenCounter) -> list[int]:
    total, out = 0, []
    for _, block in flat_blocks(prompt):
        total += counter.count(block.text)
        out.append(total)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.lists(st.sampled_from(NOTES), max_size=3), min_size=1, max_size=6),
    minimum=st.sampled_from([256, 1024, 2048, 4096]),
    layout=st.sampled_from(["default", "append-only"]),
    defer=st.booleans(),
)
def test_breakpoints_property(
    plan: list[list[str]], minimum: int, layout: str, defer: bool
) -> None:
    """At most 4, none under the minimum, and once an anchor (end of the system blocks,
    end of history) is marked it stays marked in later turns, since its prefix only grows."""
    envs = _run(plan, defer)
    counter = TokenCounter()
    before: set[str] = set()
    for i in range(len(envs)):
        prompt = build_prompt(envs[: i + 1], layout)  # type: ignore[arg-type]
        marks = anthropic_breakpoints(prompt, counter, minimum)
        prefix = _prefix_tokens(prompt, counter)
        assert len(marks) <= 4
        assert all(prefix[m] >= minimum for m in marks)
        flat = flat_blocks(prompt)
        anchors = {flat[m][1].anchor for m in marks}
        assert before - {"turn-end"} <= anchors
        before = anchors


def test_gemini_request_roles_and_system_instruction(three: list[Envelope]) -> None:
    body = render_request(three[-1], "gemini").body
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user", "model", "user"]
    assert body["systemInstruction"] == {"parts": [{"text": three[-1].system_text}]}


def test_gemini_cache_plan_moves_the_system_into_the_cache(three: list[Envelope]) -> None:
    options = request_options(
        "gemini", profile=get_profile("gemini-2.5-flash", min_cacheable_tokens=1000)
    )
    plan = gemini_cache_plan(build_prompt(three), options)
    assert plan.create is not None
    assert plan.create.body["systemInstruction"]["parts"][0]["text"] == three[-1].system_text
    assert "systemInstruction" not in plan.request.body
    assert plan.request.body["cachedContent"] == f"cachedContents/{plan.display_name}"


def test_gemini_cache_plan_skips_small_systems(three: list[Envelope]) -> None:
    plan = gemini_cache_plan(build_prompt(three[:1]), request_options("gemini"))
    assert plan.create is None
    assert "systemInstruction" in plan.request.body


def test_host_registers_its_own_request_renderer(three: list[Envelope]) -> None:
    def plain(prompt: Prompt, options: RequestOptions) -> RenderedRequest:
        return RenderedRequest(
            "openai", "/complete", {"model": options.model, "prompt": prompt.system_text}
        )

    registry = RequestRegistry.builtin()
    registry.register("plain", plain, provider="openai")
    req = render_request(three[-1], "plain", registry=registry)
    assert req.body == {"model": "gpt-4.1", "prompt": three[-1].system_text}
    assert "plain" in registry.names()


def test_registry_refuses_duplicates_and_names_unknowns() -> None:
    registry = RequestRegistry.builtin()
    with pytest.raises(RegistryError, match="already registered"):
        registry.register("openai", lambda p, o: RenderedRequest("x", "/", {}), provider="openai")
    with pytest.raises(RegistryError, match="known: anthropic, gemini, openai, openai-responses"):
        registry.get("mistral")


def _output_limit(body: dict[str, object], renderer: str) -> object:
    if renderer == "anthropic":
        return body["max_tokens"]
    if renderer == "openai":
        return body["max_completion_tokens"]
    if renderer == "openai-responses":
        return body["max_output_tokens"]
    config = body["generationConfig"]
    assert isinstance(config, dict)
    return config["maxOutputTokens"]


@pytest.mark.parametrize("renderer", ["openai", "openai-responses", "anthropic", "gemini"])
def test_every_body_carries_the_budget_reserve_as_its_output_limit(renderer: str) -> None:
    """The reserve the budget kept free is what the request asks for (the model's max if
    smaller); without a budget, the profile's reserve."""
    from lamina.pipeline import Budget

    conv = Conversation(SYSTEM, budget=Budget(20_000, 2_000))
    env = conv.turn("Hello")
    assert _output_limit(render_request(env, renderer).body, renderer) == 2_000
    assert _output_limit(render_request(env, renderer, max_tokens=77).body, renderer) == 77
    plain = Conversation(SYSTEM).turn("Hello")
    opts = request_options(RequestRegistry.builtin().provider(renderer))
    expected = min(opts.profile.default_output_reserve, opts.profile.max_output_tokens or 10**9)
    assert _output_limit(render_request(plain, renderer).body, renderer) == expected
    big = Conversation(SYSTEM, budget=Budget(1_000_000, 900_000)).turn("Hello")
    cap = opts.profile.max_output_tokens
    assert cap is not None and _output_limit(render_request(big, renderer).body, renderer) == cap
