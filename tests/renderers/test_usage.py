"""Usage read-back: SDK response objects built locally give the right predicted/observed
figures, a changed prefix is named, and the read-back is traced and persisted."""

from __future__ import annotations

from pathlib import Path

import pytest
from anthropic.types import Message, TextBlock
from anthropic.types import Usage as AnthropicUsage
from google.genai import types as gtypes
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.completion_usage import PromptTokensDetails
from openai.types.responses import ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from lamina import Conversation, load_conversation
from lamina.pipeline import Budget, Envelope, SystemPrompt
from lamina.pipeline.agent import AgentTurn, agent_call, loop_tokens
from lamina.pipeline.errors import ArgumentError, ConfigError, ConversationError
from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn
from lamina.pipeline.tokens import (
    TokenCounter,
    TurnUsage,
    Usage,
    generic_profile,
    get_profile,
    read_usage,
    request_tokens,
)
from lamina.renderers import (
    CACHE_MISS,
    instructions_tokens,
    prefix_report,
    render_request,
    simulate,
    trace_document,
    trace_usage,
    usage_record,
)

RULES = "\n".join(
    f"Rule {i}: answer about the sync engine's module {i} in two sentences, citing files."
    for i in range(260)
)


def _two_turns() -> tuple[Conversation, list[Envelope]]:
    conv = Conversation(RULES)
    first = conv.turn("What does module 3 do?")
    conv.reply("It syncs notes.")
    second = conv.turn("And module 4?")
    return conv, [first, second]


def _predicted(envelopes: list[Envelope], provider: str) -> tuple[int, int]:
    """The exact request tokens (what ``count_request`` gives) and the simulator's hit."""
    turn = simulate(envelopes, providers=(provider,), layouts=("default",)).series[0].turns[-1]
    return request_tokens(envelopes[-1], TokenCounter()), turn.cached_tokens


def _openai_hit(envelopes: list[Envelope], added: int) -> int:
    """What OpenAI serves of the last request when the one before is cached and the
    framework adds ``added`` tokens ahead of the messages (tools, instructions): that and
    the shared token prefix, in 128-token steps from 1,024."""
    shared = prefix_report(envelopes[-2], envelopes[-1], TokenCounter()).common_prefix_tokens
    return (shared + added) // 128 * 128 if shared + added >= 1024 else 0


def _chat_completion(prompt: int, cached: int) -> ChatCompletion:
    return ChatCompletion(
        id="chatcmpl-1",
        object="chat.completion",
        created=0,
        model="gpt-4.1",
        choices=[
            Choice(
                index=0,
                finish_reason="stop",
                message=ChatCompletionMessage(role="assistant", content="It syncs."),
            )
        ],
        usage=CompletionUsage(
            prompt_tokens=prompt,
            completion_tokens=5,
            total_tokens=prompt + 5,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        ),
    )


def test_the_system_prompt_is_long_enough_to_cache() -> None:
    _, envelopes = _two_turns()
    for provider in ("openai", "anthropic", "gemini"):
        assert _predicted(envelopes, provider)[1] > 2048


def test_openai_chat_completion_gives_observed_and_predicted_figures() -> None:
    _, envelopes = _two_turns()
    total, cached = _predicted(envelopes, "openai")
    usage = usage_record(envelopes, _chat_completion(total, cached), "openai", "gpt-4.1")
    assert usage.observed == Usage(total, cached, 0, 5, "openai")
    assert (usage.predicted_input, usage.predicted_cached) == (total, cached)
    assert usage.exact and usage.warning is None
    assert usage.turn == 2 and usage.model == "gpt-4.1"


def test_openai_responses_usage_object() -> None:
    usage = ResponseUsage(
        input_tokens=3000,
        input_tokens_details=InputTokensDetails(cached_tokens=2944, cache_write_tokens=56),
        output_tokens=20,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=3020,
    )
    assert read_usage(usage) == Usage(3000, 2944, 56, 20, "openai")


def test_anthropic_message_adds_cache_reads_and_writes_to_input() -> None:
    _, envelopes = _two_turns()
    _, cached = _predicted(envelopes, "anthropic")
    message = Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-sonnet-4-6",
        content=[TextBlock(type="text", text="It syncs.")],
        stop_reason="end_turn",
        stop_sequence=None,
        usage=AnthropicUsage(
            input_tokens=40,
            output_tokens=7,
            cache_read_input_tokens=3500,
            cache_creation_input_tokens=25,
        ),
    )
    usage = usage_record(envelopes, message, "anthropic", "claude-sonnet-4-6")
    assert usage.observed == Usage(3565, 3500, 25, 7, "anthropic")
    assert usage.predicted_cached == (cached * 13 + 9) // 10  # o200k count + 30% margin
    assert not usage.exact and usage.warning is None


def test_gemini_response_cached_content_token_count() -> None:
    _, envelopes = _two_turns()
    response = gtypes.GenerateContentResponse(
        usage_metadata=gtypes.GenerateContentResponseUsageMetadata(
            prompt_token_count=3600, cached_content_token_count=3072, candidates_token_count=9
        )
    )
    usage = usage_record(envelopes, response, "gemini", "gemini-2.5-flash")
    assert usage.observed == Usage(3600, 3072, 0, 9, "gemini")
    assert usage.warning is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"usage": {"prompt_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 1024}}},
            Usage(1200, 1024, 0, 0, "openai"),
        ),
        (
            {"input_tokens": 10, "cache_read_input_tokens": 2000, "output_tokens": 3},
            Usage(2010, 2000, 0, 3, "anthropic"),
        ),
        (
            {"usageMetadata": {"promptTokenCount": 2500, "cachedContentTokenCount": 2048}},
            Usage(2500, 2048, 0, 0, "gemini"),
        ),
    ],
)
def test_plain_dicts(data: dict[str, object], expected: Usage) -> None:
    assert read_usage(data) == expected


def test_a_prefix_changed_by_the_host_is_named() -> None:
    """The host prepended a date to Lamina's system message: the provider served nothing."""
    _, envelopes = _two_turns()
    total, _ = _predicted(envelopes, "openai")
    body = render_request(envelopes[-1], "openai", "gpt-4.1").body
    sent = {**body, "messages": [dict(m) for m in body["messages"]]}
    sent["messages"][0]["content"] = "Today is 2026-11-30.\n" + sent["messages"][0]["content"]
    usage = usage_record(
        envelopes, _chat_completion(total + 9, 0), "openai", "gpt-4.1", sent=sent
    )
    assert usage.warning is not None and usage.warning.code == CACHE_MISS
    assert usage.cause == "host-altered"
    assert "the request was altered by the host" in usage.warning.message
    assert "at character 0" in usage.warning.message


def test_without_the_sent_body_an_exact_count_mismatch_is_named() -> None:
    _, envelopes = _two_turns()
    total, cached = _predicted(envelopes, "openai")
    usage = usage_record(envelopes, _chat_completion(total + 9, 0), "openai", "gpt-4.1")
    assert usage.warning is not None
    assert f"predicted {cached} cached input tokens, the provider reported 0" in (
        usage.warning.message
    )
    assert usage.cause == "host-altered"
    assert f"counted {total + 9} input tokens where Lamina's request has exactly {total} (+9)" in (
        usage.warning.message
    )


def test_a_true_miss_is_not_blamed_on_the_host() -> None:
    """The provider counted exactly Lamina's request and served nothing: without the time
    since the last request the cause is unknown, and the host is not blamed."""
    _, envelopes = _two_turns()
    total, _ = _predicted(envelopes, "openai")
    usage = usage_record(envelopes, _chat_completion(total, 0), "openai", "gpt-4.1")
    assert usage.warning is not None and usage.cause == "unknown"
    assert "host" not in usage.warning.message
    assert "the provider counted exactly Lamina's request" in usage.warning.message
    assert "the time since the previous request is unknown (pass elapsed=)" in (
        usage.warning.message
    )


@pytest.mark.parametrize(
    ("provider", "elapsed", "ttl", "cause", "words"),
    [
        ("openai", 900.0, None, "expired", "900 s passed since the previous request, past "
         "OpenAI's 5-10 idle minutes"),
        ("openai", 40.0, None, "not-expired", "40 s passed since the previous request, "
         "within OpenAI's 5-10 idle minutes"),
        ("anthropic", 400.0, None, "expired", "past Anthropic's 5-minute cache TTL"),
        ("anthropic", 400.0, "1h", "not-expired", "within Anthropic's 1-hour cache TTL"),
        ("gemini", 4000.0, None, "unknown", "4000 s passed since the previous request, so it "
         "may have expired (Gemini's implicit cache lifetime (not published))"),
    ],
)
def test_the_time_between_turns_tells_expiry_from_routing(
    provider: str, elapsed: float, ttl: str | None, cause: str, words: str
) -> None:
    _, envelopes = _two_turns()
    total, _ = _predicted(envelopes, provider)
    response: object = _chat_completion(total, 0)
    if provider == "anthropic":
        response = {"input_tokens": total, "cache_read_input_tokens": 0}
    usage = usage_record(
        envelopes, response, provider, elapsed=elapsed, ttl=ttl  # type: ignore[arg-type]
    )
    assert usage.warning is not None and usage.cause == cause
    assert words in usage.warning.message


def test_a_request_sent_as_rendered_is_not_blamed_on_the_host() -> None:
    _, envelopes = _two_turns()
    total, _ = _predicted(envelopes, "openai")
    body = render_request(envelopes[-1], "openai", "gpt-4.1").body
    usage = usage_record(
        envelopes, _chat_completion(total, 0), "openai", "gpt-4.1", sent=body, elapsed=720
    )
    assert usage.cause == "expired"


def test_a_frameworks_instructions_are_predicted_and_not_blamed_on_the_host() -> None:
    """A framework sent its own instructions as a system message after Lamina's (as
    pydantic-ai does): with ``instructions=`` the predicted input and hit include them, and
    a miss of the body sent with them is the cache's (expired), not the host's."""
    _, envelopes = _two_turns()
    total, _ = _predicted(envelopes, "openai")
    rules = "Answer in one short paragraph."
    body = render_request(envelopes[-1], "openai", "gpt-4.1").body
    messages = [dict(m) for m in body["messages"]]
    sent = {**body, "messages": [messages[0], {"role": "system", "content": rules}, *messages[1:]]}
    added = instructions_tokens([rules])
    response = _chat_completion(total + added, 0)
    usage = usage_record(envelopes, response, "openai", "gpt-4.1", sent=sent, elapsed=720,
                         instructions=[rules])  # fmt: skip
    assert usage.predicted_input == total + added == usage.observed.input_tokens
    assert usage.warning is not None
    assert f"predicted {_openai_hit(envelopes, added)} cached input tokens" in usage.warning.message
    assert usage.cause == "expired"
    blamed = usage_record(envelopes, response, "openai", "gpt-4.1", sent=sent, elapsed=720)
    assert blamed.predicted_input == total and blamed.cause == "host-altered"


def test_a_prefix_change_names_the_layer() -> None:
    """The memory (L1's mutable part) changed: the stable rules are still predicted to hit,
    and a miss names the layer that changed."""
    conv = Conversation(SystemPrompt(RULES, "The user prefers short answers."))
    first = conv.turn("What does module 3 do?")
    conv.reply("It syncs notes.")
    conv.set_system(mutable="The user prefers long answers.")
    second = conv.turn("And module 4?")
    total, cached = _predicted([first, second], "openai")
    assert cached > 1024
    usage = usage_record([first, second], _chat_completion(total, 0), "openai", "gpt-4.1")
    assert usage.warning is not None and usage.cause == "prefix-changed"
    assert "the prefix changed at L1 (memory-changed)" in usage.warning.message


def test_a_system_change_predicts_no_hit_and_warns_nothing() -> None:
    conv = Conversation(RULES)
    first = conv.turn("What does module 3 do?")
    conv.reply("It syncs notes.")
    conv.set_system("Another persona.\n" + RULES)
    second = conv.turn("And module 4?")
    total, cached = _predicted([first, second], "openai")
    assert cached == 0
    usage = usage_record([first, second], _chat_completion(total, 0), "openai", "gpt-4.1")
    assert usage.warning is None


def test_usage_is_traced_and_persisted_with_the_turn(tmp_path: Path) -> None:
    conv, envelopes = _two_turns()
    total, cached = _predicted(envelopes, "openai")
    conv.record_usage(usage_record(envelopes, _chat_completion(total, cached), "openai"))
    store = SqliteStore(tmp_path / "s.db")
    store.create(ConversationInfo("c1"))
    # Turn 1 again, then turn 2 with its usage (replayed from a fresh conversation).
    again = Conversation(RULES)
    again.turn("What does module 3 do?")
    again.reply("It syncs notes.")
    save_turn(store, "c1", again)
    again.turn("And module 4?")
    again.record_usage(conv.usage[0])
    save_turn(store, "c1", again)
    loaded = load_conversation(store, "c1")
    assert loaded.usage == conv.usage
    assert store.load("c1", 1).usage == ()
    trace = trace_document(envelopes, TokenCounter(), usage=loaded.usage)
    assert "usage" not in trace["turns"][0]
    assert trace["turns"][1]["usage"] == {
        "provider": "openai",
        "model": "gpt-4.1",
        "call": 0,
        "input_tokens": total,
        "cached_tokens": cached,
        "cache_write_tokens": 0,
        "output_tokens": 5,
        "predicted": {"input_tokens": total, "cached_tokens": cached},
        "counted": conv.usage[0].counted,
        "rules": "",
        "cause": "",
        "warning": None,
    }
    store.close()


def test_record_usage_refuses_other_values_and_unbuilt_turns() -> None:
    conv, _ = _two_turns()
    with pytest.raises(ArgumentError, match="usage: must be a pipeline.TurnUsage"):
        conv.record_usage({"turn": 2})  # type: ignore[arg-type]
    with pytest.raises(ConversationError, match="turn 3, which was not built"):
        conv.record_usage(TurnUsage(3, "openai", "gpt-4.1", 0, 0, Usage(10)))
    assert conv.usage == ()


def _long_conversation(budget: Budget | None = None) -> tuple[Conversation, list[Envelope]]:
    conv = Conversation(RULES, budget=budget)
    envelopes = []
    for i in range(6):
        envelopes.append(conv.turn(f"What does module {i} do, and what calls it?"))
        conv.reply(f"Module {i} syncs notes; module {i + 1} calls it on every save.")
    return conv, envelopes


@pytest.mark.parametrize(
    "model",
    ["gpt-4.1", "gpt-4o", "claude-sonnet-4-6", "gemini-2.5-flash", "llama-3.1-8b-instruct"],
)
def test_the_predicted_input_is_count_request(model: str) -> None:
    """The prediction is the exact count of what is sent (scaled by the margin where the
    tokenizer is not local), never the simulator's ChatML-text figure (+9 a message)."""
    profile = get_profile(model)
    budget = Budget.for_model(model)
    conv, envelopes = _long_conversation(budget)
    exact = conv.count_request(envelopes[-1])
    response = {"usage": {"prompt_tokens": exact}}
    if profile.provider == "anthropic":
        response = {"input_tokens": exact, "cache_read_input_tokens": 0}
    renderer = {"openai": "openai", "anthropic": "anthropic", "gemini": "gemini"}
    usage = usage_record(
        envelopes, response, renderer[profile.provider], model, counter=conv.counter
    )
    assert usage.predicted_input == profile.effective_tokens(exact)
    assert usage.counted == exact
    assert usage.predicted_cached <= usage.predicted_input


@pytest.mark.parametrize(
    ("model", "response", "provider", "exact"),
    [
        ("claude-3-7-sonnet-20250219", "anthropic", "anthropic", False),
        ("gpt-4.5-preview", "openai", "openai", True),
        ("gemini-1.5-pro-002", "gemini", "gemini", False),
        ("anthropic/claude-3-opus", "anthropic", "anthropic", False),
    ],
)
def test_a_model_without_a_profile_uses_its_providers_generic_rules(
    model: str, response: str, provider: str, exact: bool
) -> None:
    _, envelopes = _two_turns()
    total = request_tokens(envelopes[-1], TokenCounter())
    bodies: dict[str, object] = {
        "openai": _chat_completion(total, 0),
        "anthropic": Message(
            id="msg_1",
            type="message",
            role="assistant",
            model=model,
            content=[TextBlock(type="text", text="It syncs.")],
            stop_reason="end_turn",
            stop_sequence=None,
            usage=AnthropicUsage(input_tokens=total, output_tokens=7),
        ),
        "gemini": gtypes.GenerateContentResponse(
            usage_metadata=gtypes.GenerateContentResponseUsageMetadata(
                prompt_token_count=total, candidates_token_count=9
            )
        ),
    }
    usage = usage_record(envelopes, bodies[response], model=model)
    assert (usage.provider, usage.model, usage.exact) == (provider, model, exact)
    assert usage.rules == (
        f"generic {provider} rules: no profile for {model!r} (provider from the model's name)"
    )
    assert usage.predicted_input == generic_profile(model, provider).effective_tokens(total)
    assert trace_usage(usage)["rules"] == usage.rules


def test_an_unnamed_model_takes_its_provider_from_the_usage_shape() -> None:
    _, envelopes = _two_turns()
    response = {"input_tokens": 40, "cache_read_input_tokens": 3000, "output_tokens": 3}
    usage = usage_record(envelopes, response, model="my-proxy-sonnet")
    assert usage.provider == "anthropic" and not usage.exact
    assert "provider from the usage's shape" in usage.rules
    assert usage_record(envelopes, response).model == "claude-sonnet-4-6"
    assert usage_record(envelopes, response).rules == ""


def test_a_profiled_model_records_no_generic_rules() -> None:
    _, envelopes = _two_turns()
    total, cached = _predicted(envelopes, "openai")
    usage = usage_record(envelopes, _chat_completion(total, cached), model="gpt-4.1-2025-04-14")
    assert usage.rules == "" and usage.model == "gpt-4.1"


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (
            CompletionUsage.model_validate(
                {
                    "prompt_tokens": 4444,
                    "completion_tokens": 12,
                    "total_tokens": 4456,
                    "prompt_tokens_details": {"cached_tokens": 4352, "audio_tokens": 0},
                }
            ),
            Usage(4444, 4352, 0, 12, "openai"),
        ),
        (
            ResponseUsage.model_validate(
                {
                    "input_tokens": 4444,
                    "input_tokens_details": {"cached_tokens": 4352, "cache_write_tokens": 0},
                    "output_tokens": 12,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 4456,
                }
            ),
            Usage(4444, 4352, 0, 12, "openai"),
        ),
        (
            AnthropicUsage.model_validate(
                {
                    "input_tokens": 44,
                    "cache_read_input_tokens": 4000,
                    "cache_creation_input_tokens": 400,
                    "output_tokens": 12,
                }
            ),
            Usage(4444, 4000, 400, 12, "anthropic"),
        ),
        (
            AnthropicUsage.model_validate({"input_tokens": 4444, "output_tokens": 12}),
            Usage(4444, 0, 0, 12, "anthropic"),
        ),
        (
            gtypes.GenerateContentResponseUsageMetadata.model_validate(
                {"promptTokenCount": 4444, "cachedContentTokenCount": 4096,
                 "candidatesTokenCount": 12}
            ),
            Usage(4444, 4096, 0, 12, "gemini"),
        ),
    ],
)
def test_sdk_usage_models_built_from_dicts(usage: object, expected: Usage) -> None:
    """The official SDK types, validated from the dicts each API returns: the provider is
    read from the object's shape (an Anthropic usage without cache figures included)."""
    assert read_usage(usage) == expected


SEARCH = {
    "name": "search",
    "description": "Search the project notes.",
    "parameters": {
        "type": "object",
        "properties": {"q": {"type": "string", "description": "Words to find."}},
        "required": ["q"],
    },
}


def test_tool_definitions_sent_are_in_the_predicted_input() -> None:
    """The provider counts the tools too: passed as tools=, the prediction is exact and a
    miss is not blamed on the host; without them the host-altered warning says to pass
    them."""
    from lamina.renderers import tool_tokens

    _, envelopes = _two_turns()
    total, _ = _predicted(envelopes, "openai")
    tools = tool_tokens([SEARCH], "openai", TokenCounter())
    assert tools > 20
    cached = _openai_hit(envelopes, tools)  # the tools lead the prefix, rounded with it
    hit = _chat_completion(total + tools, cached)
    usage = usage_record(envelopes, hit, "openai", "gpt-4.1", tools=[SEARCH])
    assert (usage.predicted_input, usage.predicted_cached) == (total + tools, cached)
    assert usage.counted == total + tools and usage.warning is None
    missed = _chat_completion(total + tools, 0)
    blamed = usage_record(envelopes, missed, "openai", "gpt-4.1")
    assert blamed.cause == "host-altered" and blamed.warning is not None
    assert f"({tools:+d})" in blamed.warning.message
    assert "tool definitions sent count too: pass tools=" in blamed.warning.message
    fewer = usage_record(envelopes, _chat_completion(total - 5, 0), "openai", "gpt-4.1")
    assert fewer.warning is not None and "pass tools=" not in fewer.warning.message
    told = usage_record(envelopes, missed, "openai", "gpt-4.1", tools=[SEARCH])
    assert told.cause == "unknown" and told.predicted_input == total + tools


@pytest.mark.parametrize(
    ("model", "choice", "prompt"),
    [
        ("claude-sonnet-4-6", None, 346),
        ("claude-sonnet-4-6", {"type": "auto"}, 346),
        ("claude-sonnet-4-6", {"type": "any"}, 313),
        ("claude-3-5-haiku", {"type": "tool", "name": "search"}, 340),
    ],
)
def test_anthropics_tool_prompt_is_added_as_published_for_the_tool_choice(
    model: str, choice: object, prompt: int
) -> None:
    """The definitions are counted locally and scaled by the margin; Anthropic's tool-use
    system prompt is its own count for the model and tool_choice, added as it is."""
    from anthropic.types import ToolUseBlock

    from lamina.renderers import tool_tokens

    _, envelopes = _two_turns()
    profile = get_profile(model)
    counter = TokenCounter(profile.tokenizer)
    exact = request_tokens(envelopes[-1], counter, profile.framing)
    defs = tool_tokens([SEARCH], "gemini", counter)  # the definitions as sent, no prompt
    message = Message(
        id="msg_1",
        type="message",
        role="assistant",
        model=model,
        content=[ToolUseBlock(type="tool_use", id="t1", name="search", input={"q": "sync"})],
        stop_reason="tool_use",
        stop_sequence=None,
        usage=AnthropicUsage(input_tokens=exact + defs + prompt, output_tokens=12),
    )
    usage = usage_record(envelopes, message, "anthropic", model, tools=[SEARCH], tool_choice=choice)
    assert usage.predicted_input == profile.effective_tokens(exact + defs) + prompt
    assert usage.counted == exact + defs + prompt
    without = usage_record(envelopes, message, "anthropic", model)
    assert usage.predicted_input - without.predicted_input == (
        profile.effective_tokens(exact + defs) - profile.effective_tokens(exact) + prompt
    )


@pytest.mark.parametrize(
    ("renderer", "tools", "choice"),
    [
        ("openai", [{"type": "function", "function": SEARCH}], "auto"),
        ("openai-responses", [{"type": "function", **SEARCH}], None),
        (
            "anthropic",
            [{"name": "search", "description": SEARCH["description"],
              "input_schema": SEARCH["parameters"]}, {"type": "web_search_20250305",
                                                      "name": "web_search"}],
            {"type": "any"},
        ),
        ("gemini", [{"functionDeclarations": [SEARCH]}], None),
    ],
)  # fmt: skip
def test_the_tools_of_the_body_sent_are_counted_without_tools(
    renderer: str, tools: list[dict[str, object]], choice: object
) -> None:
    """Given the body sent, its function tools and tool_choice are read from it (each
    provider's shape; a server tool has no schema and is left out): the same prediction
    as passing them, and the request is not blamed on the host for carrying them."""
    _, envelopes = _two_turns()
    body = dict(render_request(envelopes[-1], renderer).body)
    sent = {**body, "tools": tools, **({"tool_choice": choice} if choice else {})}
    response: object = _chat_completion(3000, 0)
    if renderer == "anthropic":
        response = {"input_tokens": 3000, "cache_read_input_tokens": 0}
    read = usage_record(envelopes, response, renderer, sent=sent, elapsed=30)
    given = usage_record(
        envelopes, response, renderer, sent=body, elapsed=30, tools=[SEARCH], tool_choice=choice
    )
    plain = usage_record(envelopes, response, renderer, sent=body, elapsed=30)
    assert read.predicted_input == given.predicted_input > plain.predicted_input
    expected = "unknown" if renderer == "gemini" else "not-expired"  # no published lifetime
    assert read.cause == given.cause == expected


def test_an_agent_loops_calls_are_read_back_each_against_its_request() -> None:
    """A loop's call (a ``Loop``) is predicted as sent: its count is the loop's own, an
    Anthropic call after one of the same envelope reads the whole of it (its last block
    carries a breakpoint), past the envelope's breakpoints,
    a loop in another layout is refused, and a read-back of each call is kept."""
    conv = Conversation(RULES)
    agent = AgentTurn.start(conv, "What does module 3 do?")
    first = agent.fit()
    second = agent.step(agent_call("search", {"q": "module 3"}, "Module 3 syncs notes.")).fit()
    counter = TokenCounter()
    framing = get_profile("gpt-4.1").framing
    exact = request_tokens(second.envelope, counter, framing) + loop_tokens(
        second.steps, counter, framing
    )
    usage = usage_record([first, second], _chat_completion(exact, 0), "openai", "gpt-4.1")
    assert (usage.predicted_input, usage.call, usage.turn) == (exact, 2, 1)
    shared = first.tokens - framing.priming  # the first call's messages, whole
    assert usage.predicted_cached == shared - shared % 128
    anthropic = usage_record([first, second], {"input_tokens": 10}, "anthropic")
    again = usage_record([first.envelope, first.envelope], {"input_tokens": 10}, "anthropic")
    assert anthropic.predicted_cached > again.predicted_cached > 0
    with pytest.raises(ConfigError, match="default layout"):
        usage_record([first, second], {"input_tokens": 10}, "openai", layout="append-only")
    conv.record_usage(usage)
    conv.record_usage(usage_record([first], _chat_completion(first.tokens, 0), "openai"))
    assert [(u.turn, u.call) for u in conv.usage] == [(1, 1), (1, 2)]
