"""The process summary pool: conversations share a summary made for the same bytes by the
same summarizer with the same settings, within a bound, from any thread."""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path

import attrs
import pytest

from lamina import Conversation, load_conversation, parse_script, run_saved
from lamina.pipeline import Budget, Form
from lamina.pipeline.errors import ConfigError
from lamina.pipeline.store import ConversationInfo, SqliteStore
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.views import (
    LLMSummarizer,
    SummaryCache,
    SummaryPool,
    SummaryResult,
    TextRankSummarizer,
    summary_pool,
)
from lamina.renderers import openai_messages

COUNTER = TokenCounter()


def _note(i: int, size: int) -> str:
    body = "\n\n".join(
        f"## Section {s}\n\n"
        + " ".join(f"Fact {i}.{s}.{k} about store {i} and sync {k % 7}." for k in range(size))
        for s in range(4)
    )
    return f"# Note {i}\n\n{body}\n"


BIG = _note(1, 40)
# Turn 2 attaches other.md: the budget cuts the library's preview of big.md to a
# summary (one of about 180 tokens, between two of the previews of that preview), which
# turn 3 sends again (other.md, held as a preview there, is summarized too and keeps a
# preview).
TURNS = [
    {"user": "q1", "attach": [{"note": "big.md"}], "reply": "answer 1"},
    {"user": "q2", "attach": [{"note": "other.md"}], "reply": "answer 2"},
    {"user": "q3", "attach": [{"note": "big.md"}], "reply": "answer 3"},
]
SUMMARIZING = Budget(875, 200)


@pytest.fixture
def big_vault(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    root.mkdir()
    (root / "big.md").write_text(BIG, encoding="utf-8")
    (root / "other.md").write_text(_note(2, 10), encoding="utf-8")
    return root


@attrs.define
class _Counting:
    """A real summarizer that counts its calls (it keeps the inner summarizer's id)."""

    inner: TextRankSummarizer | LLMSummarizer
    calls: int = 0

    @property
    def id(self) -> str:
        return self.inner.id

    def summarize(self, text: str, target_tokens: int) -> SummaryResult:
        self.calls += 1
        return self.inner.summarize(text, target_tokens)


_SENTENCE = " The note lists facts about the store and how it syncs."


def summary_answer(prompt: str, number: int) -> str:
    """What a summarizing model answers ``prompt``: numbered (so reuse is visible), about
    three quarters of the tokens it asks for at most (a summary of the size asked for)."""
    found = re.search(r"in at most (\d+) tokens", prompt)
    assert found is not None, prompt[:200]
    sentences = max(0, (int(found.group(1)) * 3 // 4 - 8) // 12)
    return f"Summary number {number} of the text." + _SENTENCE * sentences


def _numbered() -> tuple[LLMSummarizer, list[int]]:
    """An LLM summarizer whose every call answers differently (so reuse is visible)."""
    numbers, calls = itertools.count(1), []

    def complete(prompt: str) -> str:
        calls.append(next(numbers))
        return summary_answer(prompt, calls[-1])

    return LLMSummarizer(complete, COUNTER), calls


def _chat(vault: Path, summarizer: object) -> Conversation:
    return Conversation("Be terse.", vault=vault, budget=SUMMARIZING, summarizer=summarizer)


def test_a_second_conversation_reuses_the_summary_without_running_the_summarizer(
    big_vault: Path,
) -> None:
    first, second = _Counting(TextRankSummarizer(COUNTER)), _Counting(TextRankSummarizer(COUNTER))
    sent = []
    for summarizer in (first, second):
        conv = _chat(big_vault, summarizer)
        for t in TURNS:
            env = conv.turn(t["user"], t["attach"])
            conv.reply(t["reply"])
        sent.append(openai_messages(env))
    assert first.calls >= 1
    assert second.calls == 0
    assert sent[0] == sent[1]


def test_a_conversation_sends_only_the_summaries_its_own_summarizer_made(
    big_vault: Path,
) -> None:
    """Two conversations of one process, the same chat, two summarizers: each sends the
    summary its own made. (The budget's forms, remembered for the whole process, were
    keyed without the summarizer: the second conversation sent the first one's TextRank
    summary under its LLM summarizer's name.)"""
    texts = []
    for summarizer in (TextRankSummarizer(COUNTER), _numbered()[0]):
        conv = _chat(big_vault, summarizer)
        for t in TURNS[:2]:
            env = conv.turn(t["user"], t["attach"])
            conv.reply(t["reply"])
        (entry,) = env.l2.segments
        assert entry.form is Form.SUMMARY
        texts.append(entry.text)
    ranked, numbered = texts
    assert "Summary number" not in ranked
    assert "Summary number 1 of the text." in numbered


def test_summarizers_with_other_settings_do_not_share() -> None:
    pool = SummaryPool()
    plain = _Counting(TextRankSummarizer(COUNTER))
    narrow = _Counting(TextRankSummarizer(COUNTER, window=5))
    assert plain.id != narrow.id
    for summarizer in (plain, narrow):
        SummaryCache(pool=pool).summarize(summarizer, "h", BIG, 100)
    assert (plain.calls, narrow.calls) == (1, 1)
    llm, calls = _numbered()
    SummaryCache(pool=pool).summarize(llm, "h", BIG, 100)
    made = len(calls)
    SummaryCache(pool=pool).summarize(attrs.evolve(llm, chunk_tokens=100), "h", BIG, 100)
    assert len(calls) > made


def test_textrank_ids_name_every_setting_that_is_not_the_default() -> None:
    assert TextRankSummarizer(COUNTER).id == "textrank-v1:o200k_base"
    assert TextRankSummarizer(COUNTER, damping=0.9).id == (
        "textrank-v1:o200k_base:window=100,damping=0.9,max_iter=100,tol=1e-06"
    )


def test_the_pool_evicts_the_least_recently_used_past_its_bound() -> None:
    pool = SummaryPool(max_chars=100)
    for name in ("a", "b", "c"):
        pool.put_summary((name, 10, "s"), SummaryResult(name * 40))
    assert pool.get_summary(("a", 10, "s")) is None
    assert pool.get_summary(("b", 10, "s")) == SummaryResult("b" * 40)  # now the newest
    pool.put_summary(("d", 10, "s"), SummaryResult("d" * 40))
    assert pool.get_summary(("c", 10, "s")) is None
    assert pool.get_summary(("b", 10, "s")) is not None
    assert (len(pool), pool.chars) == (2, 80)


def test_resizing_to_zero_turns_the_pool_off_and_a_negative_bound_is_refused() -> None:
    pool = SummaryPool()
    pool.put_summary(("a", 10, "s"), SummaryResult("text"))
    pool.resize(0)
    pool.put_summary(("b", 10, "s"), SummaryResult("text"))
    assert len(pool) == 0
    with pytest.raises(ConfigError, match="max_chars"):
        SummaryPool(max_chars=-1)


def test_summaries_with_failures_are_not_pooled() -> None:
    pool = SummaryPool()
    pool.put_summary(("a", 10, "s"), SummaryResult("cut text", ("round 1: timed out",)))
    assert pool.get_summary(("a", 10, "s")) is None


def test_textrank_ranks_a_text_once_for_every_target() -> None:
    summarizer = TextRankSummarizer(COUNTER)
    fresh = [summarizer.summarize(BIG, target).text for target in (60, 120, 240)]
    pool = summary_pool()
    assert len(pool) == 1  # one ranking, three cuts
    assert pool.hits == 2
    pool.resize(0)
    try:
        assert [summarizer.summarize(BIG, t).text for t in (60, 120, 240)] == fresh
    finally:
        pool.resize(SummaryPool().max_chars)


def test_a_pooled_ranking_holds_little_more_than_its_text() -> None:
    """The pool keeps a ranking per text for the life of the process: its sentences share
    one string and their numbers sit in arrays (an object per sentence held about six
    times the text's characters)."""
    import tracemalloc

    summarizer = TextRankSummarizer(COUNTER)
    summarizer.summarize(BIG, 60)  # imports, regexes and counts made outside the window
    summary_pool().clear()
    tracemalloc.start()
    summarizer.summarize(BIG, 60)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(summary_pool()) == 1
    assert held < 3 * len(BIG)


def test_a_summary_from_the_pool_is_saved_with_the_turn_and_renders_after_a_restore(
    big_vault: Path, tmp_path: Path
) -> None:
    summarizer, calls = _numbered()
    elsewhere = _chat(big_vault, summarizer)  # another conversation of the process
    for t in TURNS:
        elsewhere.turn(t["user"], t["attach"])
        elsewhere.reply(t["reply"])
    assert calls == [1, 2]  # big.md's at turn 2, other.md's at turn 3 (not sent)
    conv = _chat(big_vault, summarizer)
    with SqliteStore(tmp_path / "chat.db") as store:
        store.create(ConversationInfo("c"))
        run_saved(parse_script({"turns": TURNS}), conv, store, "c")
        assert calls == [1, 2]  # the pool's summaries, saved with turns 2 and 3
        expected = openai_messages(conv.turn("q4", [{"note": "big.md"}]))
        summary_pool().clear()
        restored = load_conversation(store, "c", vault=big_vault, summarizer=summarizer)
        again = openai_messages(restored.turn("q4", [{"note": "big.md"}]))
    assert calls == [1, 2]
    assert any("Summary number 1 of the text." in m["content"] for m in expected)
    assert again == expected


def test_threads_sharing_the_pool_get_the_summaries_one_thread_makes() -> None:
    texts = [_note(i, 12) for i in range(6)]
    summarizer = TextRankSummarizer(COUNTER)
    expected = [SummaryCache(pool=None).summarize(summarizer, str(i), t, 80) for i, t in
                enumerate(texts)]  # fmt: skip
    pool = SummaryPool(max_chars=3000)  # small enough to evict while threads work
    results: list[list[SummaryResult]] = []
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            mine = SummaryCache(pool=pool)
            order = [(offset + k) % len(texts) for k in range(len(texts))]
            got = {i: mine.summarize(summarizer, str(i), texts[i], 80) for i in order}
            results.append([got[i] for i in range(len(texts))])
        except BaseException as exc:  # pragma: no cover - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [expected] * 8
    assert 0 < pool.chars <= 3000


@attrs.frozen
class _RankLog(TextRankSummarizer):
    """TextRank that logs where each text is ranked: "promotion" (on the promotion's
    thread, or while the test waits for it) or "turn" (by the turn's budget cuts)."""

    phase: list[str] = attrs.field(factory=lambda: ["turn"], eq=False)
    log: list[str] = attrs.field(factory=list, eq=False)

    def _rank(self, text: str):  # type: ignore[no-untyped-def]
        background = threading.current_thread().name.startswith("lamina-promote")
        self.log.append("promotion" if background else self.phase[0])
        return super()._rank(text)


def _long_chat(vault: Path, summarizer: object, phase: list[str]) -> list[object]:
    """Twelve turns, each adding a new note, under a window the library outgrows; the
    promotion is waited for apart from the turn (``phase`` says which is running)."""
    budget = Budget(3000, 200, cache_weight=0.0)  # cuts fall across the library: summaries
    conv = Conversation("Be terse.", vault=vault, budget=budget, summarizer=summarizer)
    sent = []
    for i in range(12):
        phase[0] = "turn"
        env = conv.turn(f"q{i}", [{"note": f"n{i}.md"}])
        cuts = any(d.layer == "L2" for d in env.report.decisions if d.stage == "budget")
        phase[0] = "promotion"
        _ = conv.library
        sent.append((cuts, openai_messages(env)))
        conv.reply(f"answer {i}")
    return sent


def test_a_library_over_half_the_window_ranks_new_entries_during_promotion(
    tmp_path: Path,
) -> None:
    for i in range(12):
        (tmp_path / f"n{i}.md").write_text(_note(i, 6 + i % 5), encoding="utf-8")
    ahead = _RankLog(COUNTER)
    sent = _long_chat(tmp_path, ahead, ahead.phase)
    assert sum(cuts for cuts, _ in sent) >= 5  # the budget summarized library entries
    # Entries promoted once the library filled half the window are ranked while promoting;
    # the cuts rank only those promoted before (the first few notes).
    assert ahead.log.count("promotion") >= 6
    assert ahead.log.count("turn") <= 3
    summary_pool().clear()
    late = _Counting(TextRankSummarizer(COUNTER))  # no prepare(): every ranking in a cut
    assert _long_chat(tmp_path, late, ["turn"]) == sent  # the same requests either way
    assert late.calls >= 3  # a summary is made only when a solve takes it


def test_a_turn_waited_for_at_once_promotes_without_ranking(tmp_path: Path) -> None:
    """``turn(background=False)`` (``stateless_turn``'s): the promotion is made at its first
    use and prepares no summaries, which would only move ranking onto this request's path;
    the library is the same."""
    for i in range(6):
        (tmp_path / f"n{i}.md").write_text(_note(i, 10), encoding="utf-8")
    logs = []
    for background in (True, False):
        summary_pool().clear()
        ranks = _RankLog(COUNTER)
        conv = Conversation("Be terse.", vault=tmp_path, budget=Budget(3000, 200), summarizer=ranks)
        conv.turn("q", [{"note": f"n{i}.md"} for i in range(6)], background=background)
        logs.append((ranks.log, conv.library))
    (ranked, library), (not_ranked, same) = logs
    assert ranked and not_ranked == []
    assert same == library


def test_chat30_decides_the_same_whatever_other_chats_summarized_before() -> None:
    """A summary other conversations of the process made (the pool) is not read when the
    budget prices a summary rung: chat30 at 6,000 sends the same requests alone as after
    the same chat at 3,000 and 4,000 (which once also unfolded an index into an entry the
    library held again on its own: two entries under one key)."""
    from lamina import load_script, run_script

    script = load_script(Path(__file__).resolve().parents[2] / "examples" / "chat30.yaml")

    def run(window: int) -> list[str]:
        conv = Conversation(script.system, vault=script.vault, budget=Budget(window, window // 4))
        return [e.system_text + e.user_text for e in run_script(script, conv)]

    summary_pool().clear()
    alone = run(6000)
    summary_pool().clear()
    run(3000)
    run(4000)
    assert run(6000) == alone
