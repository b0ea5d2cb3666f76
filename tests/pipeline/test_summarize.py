"""Summarizers and the summary memo (pipeline._views.summarize)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lamina.pipeline._errors import ConfigError
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._views.summarize import (
    LLMSummarizer,
    Summarizer,
    SummaryCache,
    SummaryResult,
    TextRankSummarizer,
)

COUNTER = TokenCounter()

DOC = """# Caching

Prompt caching saves money when the prefix of a request stays the same.
The cached prefix covers the system prompt and the library.
Cats sleep most of the day, dreaming of mice, birds, sunny windowsills and long quiet afternoons.

# Budget

A budget keeps the request inside the window of the model.
The budget cuts history first and keeps the cached prefix stable.
Bananas are yellow when ripe, green before, brown after, and sold by weight in most markets.
"""


def _long_doc(paragraphs: int = 60) -> str:
    topics = ["cache prefix", "token budget", "history cut", "library entry", "summary memo"]
    parts = []
    for i in range(paragraphs):
        topic = topics[i % len(topics)]
        if i % 10 == 0:
            parts.append(f"## Part {i // 10}")
        parts.append(
            f"Paragraph {i} talks about the {topic}. The {topic} matters for request {i}. "
            f"Unrelated filler sentence number {i} mentions weather."
        )
    return "\n\n".join(parts)


# --- TextRank --------------------------------------------------------------------------


def test_textrank_is_a_summarizer_with_a_stable_id() -> None:
    summarizer = TextRankSummarizer(COUNTER)
    assert isinstance(summarizer, Summarizer)
    assert summarizer.id == "textrank-v1:o200k_base"


def test_textrank_is_deterministic() -> None:
    doc = _long_doc()
    first = TextRankSummarizer(TokenCounter()).summarize(doc, 150)
    second = TextRankSummarizer(TokenCounter()).summarize(doc, 150)
    assert first.text.encode() == second.text.encode()


@pytest.mark.parametrize("target", [20, 60, 150, 400])
def test_textrank_respects_the_target(target: int) -> None:
    result = TextRankSummarizer(COUNTER).summarize(_long_doc(), target)
    assert 0 < COUNTER.count(result.text) <= target
    assert result.failures == ()


def test_textrank_keeps_text_that_fits() -> None:
    assert TextRankSummarizer(COUNTER).summarize(DOC, 500).text == DOC


def test_textrank_is_extractive_and_in_document_order() -> None:
    doc = _long_doc()
    result = TextRankSummarizer(COUNTER).summarize(doc, 200)
    positions = []
    for line in result.text.split("\n\n"):
        for sentence in line.split(". "):
            pos = doc.find(sentence.rstrip("."))
            assert pos >= 0, sentence
            positions.append(pos)
    assert positions == sorted(positions)


def test_textrank_prefers_central_sentences_and_keeps_their_headings() -> None:
    result = TextRankSummarizer(COUNTER).summarize(DOC, 45)
    assert "Cats" not in result.text and "Bananas" not in result.text
    assert "cached prefix" in result.text
    assert result.text.startswith("# ")


def test_textrank_without_sentences_cuts_at_a_word() -> None:
    text = "```\n" + "code " * 500 + "\n```"
    result = TextRankSummarizer(COUNTER).summarize(text, 30)
    assert text.startswith(result.text) and COUNTER.count(result.text) <= 30


# --- LLM map-reduce --------------------------------------------------------------------


def _chunk_text(prompt: str) -> str:
    return prompt.split("<text>\n", 1)[-1].split("\n</text>", 1)[0]


def test_llm_summarizer_maps_chunks_and_reduces() -> None:
    prompts: list[str] = []

    def complete(prompt: str) -> str:
        prompts.append(prompt)
        return "short summary."

    summarizer = LLMSummarizer(complete, COUNTER, chunk_tokens=200)
    result = summarizer.summarize(_long_doc(), 100)
    assert result.failures == ()
    assert COUNTER.count(result.text) <= 100
    assert sum("<text>" in p for p in prompts) > 1
    assert result.text.startswith("short summary.")


def test_failed_chunks_keep_their_original_and_are_reported() -> None:
    def complete(prompt: str) -> str:
        if "Paragraph 0 " in _chunk_text(prompt):
            raise RuntimeError("provider said no")
        if "Paragraph 20 " in _chunk_text(prompt):
            return "   "
        return "ok."

    summarizer = LLMSummarizer(complete, COUNTER, chunk_tokens=200)
    result = summarizer.summarize(_long_doc(), 300)
    assert COUNTER.count(result.text) <= 300
    joined = "\n".join(result.failures)
    assert "RuntimeError: provider said no" in joined
    assert "returned an empty summary" in joined
    assert "kept its original text" in joined
    assert "Paragraph 0 talks about the cache prefix." in result.text


def test_async_complete_that_is_slow_times_out_and_is_reported() -> None:
    async def complete(prompt: str) -> str:
        if "Paragraph 0 " in _chunk_text(prompt):
            await asyncio.sleep(10)
        return "fine."

    summarizer = LLMSummarizer(complete, COUNTER, chunk_tokens=200, timeout=0.2)
    start = time.monotonic()
    result = summarizer.summarize(_long_doc(), 300)
    assert time.monotonic() - start < 5
    assert any("timed out after 0.2 s" in f for f in result.failures)
    assert COUNTER.count(result.text) <= 300


def test_sync_complete_that_is_slow_times_out() -> None:
    release = threading.Event()

    def complete(prompt: str) -> str:
        if "Paragraph 0 " in _chunk_text(prompt):
            release.wait(5)
        return "fine."

    summarizer = LLMSummarizer(complete, COUNTER, chunk_tokens=200, timeout=0.2)
    try:
        start = time.monotonic()
        result = summarizer.summarize(_long_doc(), 300)
        assert time.monotonic() - start < 4
    finally:
        release.set()
    assert any("timed out" in f for f in result.failures)


def test_too_long_summaries_are_cut_to_fit_and_reported() -> None:
    def complete(prompt: str) -> str:
        return "This summary rambles on. " * 400

    result = LLMSummarizer(complete, COUNTER, chunk_tokens=200).summarize(_long_doc(), 80)
    assert COUNTER.count(result.text) <= 80
    assert any("cut to fit" in f for f in result.failures)
    assert result.text.endswith("rambles on.")


def test_concurrency_is_bounded() -> None:
    active = 0
    peak = 0

    async def complete(prompt: str) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        return "s."

    LLMSummarizer(complete, COUNTER, chunk_tokens=100, concurrency=2).summarize(_long_doc(), 50)
    assert peak == 2


def test_summarize_works_inside_a_running_event_loop() -> None:
    summarizer = LLMSummarizer(lambda prompt: "inside.", COUNTER, chunk_tokens=200)

    async def host() -> SummaryResult:
        return summarizer.summarize(_long_doc(), 100)

    assert asyncio.run(host()).text.startswith("inside.")


def test_asummarize_is_awaitable() -> None:
    async def complete(prompt: str) -> str:
        return "awaited."

    summarizer = LLMSummarizer(complete, COUNTER, chunk_tokens=200)
    result = asyncio.run(summarizer.asummarize(_long_doc(), 100))
    assert result.text.startswith("awaited.") and result.failures == ()


def test_llm_summarizer_keeps_text_that_fits_without_calling() -> None:
    def complete(prompt: str) -> str:
        raise AssertionError("must not be called")

    assert LLMSummarizer(complete, COUNTER).summarize("tiny", 50) == SummaryResult("tiny")


def test_bad_llm_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="chunk_tokens"):
        LLMSummarizer(lambda p: p, COUNTER, chunk_tokens=10)
    with pytest.raises(ConfigError, match="concurrency"):
        LLMSummarizer(lambda p: p, COUNTER, concurrency=0)


# --- memo ------------------------------------------------------------------------------


class _Counting:
    def __init__(self, id: str = "counting") -> None:
        self.id = id
        self.calls = 0

    def summarize(self, text: str, target_tokens: int) -> SummaryResult:
        self.calls += 1
        return SummaryResult(f"{text[:5]} #{self.calls}")


def test_summary_cache_hits_on_same_hash_target_and_id() -> None:
    cache = SummaryCache()
    summarizer = _Counting()
    first = cache.summarize(summarizer, "h1", "some text", 100)
    second = cache.summarize(summarizer, "h1", "some text", 100)
    assert first == second == SummaryResult("some  #1")
    assert (summarizer.calls, cache.hits, cache.misses, len(cache)) == (1, 1, 1, 1)


def test_summary_cache_misses_on_other_target_or_summarizer() -> None:
    cache = SummaryCache()
    summarizer = _Counting()
    cache.summarize(summarizer, "h1", "some text", 100)
    cache.summarize(summarizer, "h1", "some text", 50)
    cache.summarize(_Counting("other"), "h1", "some text", 100)
    assert cache.misses == 3 and len(cache) == 3


def test_summary_cache_first_write_wins() -> None:
    cache = SummaryCache()
    cache.put("h", 10, "s", SummaryResult("first"))
    cache.put("h", 10, "s", SummaryResult("second"))
    assert cache.get("h", 10, "s") == SummaryResult("first")
    assert cache.get("h", 11, "s") is None
