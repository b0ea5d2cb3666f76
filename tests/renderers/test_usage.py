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
from pipeline import (
    ArgumentError,
    ConversationError,
    ConversationInfo,
    Envelope,
    SqliteStore,
    TokenCounter,
    TurnUsage,
    Usage,
    read_usage,
    save_turn,
)
from renderers import CACHE_MISS, render_request, simulate, trace_document, usage_record

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
    turn = simulate(envelopes, providers=(provider,), layouts=("default",)).series[0].turns[-1]
    return turn.input_tokens, turn.cached_tokens


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
    assert "the prefix changed" in usage.warning.message
    assert "at character 0" in usage.warning.message


def test_without_the_sent_body_an_exact_count_mismatch_is_named() -> None:
    _, envelopes = _two_turns()
    total, cached = _predicted(envelopes, "openai")
    usage = usage_record(envelopes, _chat_completion(total + 9, 0), "openai", "gpt-4.1")
    assert usage.warning is not None
    assert f"predicted {cached} cached input tokens, the provider reported 0" in (
        usage.warning.message
    )
    assert f"counted {total + 9} input tokens where Lamina's rendering has {total}" in (
        usage.warning.message
    )


def test_an_expired_cache_is_the_fallback_reason() -> None:
    _, envelopes = _two_turns()
    total, _ = _predicted(envelopes, "openai")
    usage = usage_record(envelopes, _chat_completion(total, 0), "openai", "gpt-4.1")
    assert usage.warning is not None
    assert "expired" in usage.warning.message


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
        "input_tokens": total,
        "cached_tokens": cached,
        "cache_write_tokens": 0,
        "output_tokens": 5,
        "predicted": {"input_tokens": total, "cached_tokens": cached},
        "counted": conv.usage[0].counted,
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
