"""A reload keeps the budget and the memoized summaries, so later turns stay byte-identical."""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import xxhash

from lamina import Conversation, load_conversation, parse_script, run_saved
from lamina.pipeline import Budget, BudgetSettings
from lamina.pipeline.errors import StoreError
from lamina.pipeline.store import ConversationInfo, SqliteStore, save_turn
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.views import LLMSummarizer
from lamina.renderers import openai_messages
from tests.cli import lamina
from tests.pipeline.test_summary_pool import summary_answer
from tests.stores import Backend


def _note(i: int, size: int) -> str:
    body = "\n\n".join(
        f"## Section {s}\n\n" + " ".join(f"Fact {i}.{s}.{k} about store {i}." for k in range(size))
        for s in range(4)
    )
    return f"# Note {i}\n\n{body}\n"


@pytest.fixture
def big_vault(tmp_path: Path) -> Path:
    """Two notes: big.md (about 1,300 tokens) and other.md (about 350)."""
    root = tmp_path / "bigvault"
    root.mkdir()
    (root / "big.md").write_text(_note(1, 40), encoding="utf-8")
    (root / "other.md").write_text(_note(2, 10), encoding="utf-8")
    return root


# Turn 2 attaches other.md: the budget cuts the library's preview of big.md to a summary,
# which turns 3 and 4 send again.
TURNS: list[dict[str, Any]] = [
    {"user": "q1", "attach": [{"note": "big.md"}], "reply": "answer 1"},
    {"user": "q2", "attach": [{"note": "other.md"}], "reply": "answer 2"},
    {"user": "q3", "attach": [{"note": "big.md"}], "reply": "answer 3"},
    {"user": "q4", "attach": [{"note": "big.md"}], "reply": "answer 4"},
    {"user": "q5", "attach": [{"note": "other.md"}, {"note": "big.md"}]},
]
WINDOW = ("--window", "1500", "--reserve", "200")
# A budget small enough that the library's copy of big.md is summarized (a summary of
# about 180 tokens, between two of the previews of the preview turn 1 sent).
SUMMARIZING = Budget(850, 200)


def _write(path: Path, body: dict[str, Any]) -> str:
    path.write_text(json.dumps(body), encoding="utf-8")
    return str(path)


def test_resume_without_budget_flags_continues_with_the_saved_budget(
    tmp_path: Path, big_vault: Path, backend: Backend
) -> None:
    whole = lamina(
        "run", _write(tmp_path / "all.json", {"system": "Be terse.", "turns": TURNS}),
        "--vault", str(big_vault), "--json", *WINDOW,
    )  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    head = lamina(
        "run", _write(tmp_path / "head.json", {"system": "Be terse.", "turns": TURNS[:3]}),
        "--vault", str(big_vault), "--json", "--store", backend.value,
        "--conversation", "c", *WINDOW,
    )  # fmt: skip
    assert head.returncode == 0, head.stderr
    tail = lamina(
        "resume", backend.value, "--conversation", "c",
        "--script", _write(tmp_path / "tail.json", {"turns": TURNS[3:]}), "--json",
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    resumed = json.loads(tail.stdout)["turns"]
    assert [t["budget"]["window"] for t in resumed] == [1500, 1500]
    assert any(t["budget"]["decisions"] for t in resumed)
    joined = json.loads(head.stdout)["turns"] + resumed
    assert json.dumps(joined) == json.dumps(json.loads(whole.stdout)["turns"])


def test_budget_flags_on_resume_replace_the_saved_budget(
    tmp_path: Path, big_vault: Path, backend: Backend
) -> None:
    with backend.open() as store:
        store.create(ConversationInfo("c", vault=str(big_vault)))
        conv = Conversation("Be terse.", vault=big_vault, budget=Budget(1500, 200))
        run_saved(parse_script({"turns": TURNS[:2]}), conv, store, "c")
    tail = lamina(
        "resume", backend.value, "--conversation", "c",
        "--script", _write(tmp_path / "tail.json", {"turns": TURNS[2:3]}), "--json",
        "--window", "6000", "--reserve", "500",
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    budget = json.loads(tail.stdout)["turns"][0]["budget"]
    assert (budget["window"], budget["reserve_output"], budget["decisions"]) == (6000, 500, [])


def test_state_records_the_budget_and_restore_rebuilds_it(backend: Backend, vault: Path) -> None:
    budget = Budget(2000, 300, safety_margin=0.1, headroom=0.1, cache_weight=0.5)
    conv = Conversation("Be terse.", vault=vault, budget=budget)
    env = conv.turn("hi", [{"note": "project-spec.md"}])
    with backend.open() as store:
        store.create(ConversationInfo("c"))
        save_turn(store, "c", conv, env)
        state = store.load("c")
        again = load_conversation(store, "c", vault=vault)
    assert state.budget == BudgetSettings(2000, 300, 3, 3, 0.1, headroom=0.1, cache_weight=0.5)
    assert again.budget == budget


@pytest.mark.parametrize(("window", "reserve"), [(8000, 4096), (8000, None), (20_000, 300)])
def test_a_saved_budget_reads_back_with_the_reserve_it_was_saved_with(
    backend: Backend, vault: Path, window: int, reserve: int | None
) -> None:
    """The reserve is stored as a number, never as "the default": a budget saved with the
    old default (4,096 at 8,000) keeps it, one saved at the default keeps that figure."""
    budget = Budget(window) if reserve is None else Budget(window, reserve)
    conv = Conversation("Be terse.", vault=vault, budget=budget)
    env = conv.turn("hi", [{"note": "project-spec.md"}])
    with backend.open() as store:
        store.create(ConversationInfo("c"))
        save_turn(store, "c", conv, env)
        again = load_conversation(store, "c", vault=vault)
    assert again.budget is not None
    expected = min(4096, window // 4) if reserve is None else reserve
    assert again.budget.reserve_output == budget.reserve_output == expected


def test_an_explicit_budget_wins_over_the_saved_one(vault: Path) -> None:
    conv = Conversation(vault=vault, budget=Budget(2000, 300))
    conv.turn("hi")
    explicit = Budget(9000, 100)
    assert Conversation.restore(conv.state, vault=vault, budget=explicit).budget is explicit


def test_budget_settings_hold_every_budget_field() -> None:
    budget_fields = [f.name for f in attrs.fields(Budget)]
    assert [f.name for f in attrs.fields(BudgetSettings)] == budget_fields
    budget = Budget.for_model("claude-sonnet-4", cache_weight=0.5)
    assert BudgetSettings.of(budget).budget() == budget


def _rewrite_saved_state(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """Point the one saved turn of the SQLite store at ``path`` to its state blob as
    ``change`` leaves it (a state an older or another version wrote)."""
    db = sqlite3.connect(path)
    (digest,) = db.execute("SELECT state_hash FROM turns").fetchone()
    (blob,) = db.execute("SELECT body FROM snapshots WHERE hash = ?", (digest,)).fetchone()
    plain = json.loads(zlib.decompress(blob))
    change(plain)
    body = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    old = xxhash.xxh3_128_hexdigest(body)
    with db:
        db.execute("INSERT INTO snapshots VALUES (?, 'state', ?)", (old, zlib.compress(body)))
        db.execute("UPDATE turns SET state_hash = ?", (old,))
    db.close()


def test_a_state_saved_before_budgets_were_kept_loads_without_one(
    tmp_path: Path, vault: Path
) -> None:
    """A stored state blob with no "budget" key (older stores) loads, budget None."""
    path = tmp_path / "s.db"
    conv = Conversation("Be terse.", vault=vault, budget=Budget(2000, 300))
    env = conv.turn("hi", [{"note": "project-spec.md"}])
    with SqliteStore(path) as store:
        store.create(ConversationInfo("c"))
        save_turn(store, "c", conv, env)
    _rewrite_saved_state(path, lambda plain: plain.pop("budget"))
    with SqliteStore(path) as store:
        assert store.load("c").budget is None
        assert load_conversation(store, "c", vault=vault).budget is None


@pytest.mark.parametrize(
    "dropped",
    [
        {"history_step": 2, "reply_tokens": 99, "summary_tokens": 128},
        {"policy": "current-first", "plan": "x", "stub_share": 0.05},
    ],
)
def test_a_budget_saved_with_a_setting_no_longer_kept_loads_without_it(
    tmp_path: Path, vault: Path, dropped: dict[str, Any]
) -> None:
    """A stored budget naming settings the objective replaced (the history step, the reply
    and summary limits) or the cut cascade's reads back without them, the rest kept."""
    path = tmp_path / "s.db"
    budget = Budget(2000, 300, headroom=0.1)
    conv = Conversation("Be terse.", vault=vault, budget=budget)
    env = conv.turn("hi", [{"note": "project-spec.md"}])
    with SqliteStore(path) as store:
        store.create(ConversationInfo("c"))
        save_turn(store, "c", conv, env)
    _rewrite_saved_state(path, lambda plain: plain["budget"].update(dropped))
    with SqliteStore(path) as store:
        assert store.load("c").budget == BudgetSettings.of(budget)
        assert load_conversation(store, "c", vault=vault).budget == budget


def test_the_budget_s_policy_knobs_are_the_five() -> None:
    """Besides the window, reserve and framing facts, a budget has five settings."""
    facts = {"context_window", "reserve_output", "per_message_tokens", "priming_tokens"}
    facts |= {"safety_margin", "tokenizer", "content_lead", "trim_content", "chat_template"}
    facts |= {"tool_call_tokens", "default_system"}
    knobs = {f.name for f in attrs.fields(BudgetSettings)} - facts
    assert knobs == {"headroom", "cache_weight", "text_free_share", "source_weights", "recall"}


# --- memoized summaries ----------------------------------------------------------------

# Run in a fresh process: load the chat saved after turn 3, run turn 4 with a summarizer
# whose answers start at 1000 (a new summary would show), print the request and the calls.
_RESUME = """
import itertools, json, sys
from lamina import load_conversation
from lamina.pipeline.store import open_store
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.views import LLMSummarizer
from lamina.renderers import openai_messages

store_path, vault = sys.argv[1], sys.argv[2]
numbers, calls = itertools.count(1000), []
def complete(prompt):
    calls.append(next(numbers))
    return f"Summary number {calls[-1]} of the text."
summarizer = LLMSummarizer(complete, TokenCounter())
with open_store(store_path) as store:
    conv = load_conversation(store, "c", vault=vault, summarizer=summarizer)
    env = conv.turn("q4", [{"note": "big.md"}])
print(json.dumps({"messages": openai_messages(env), "calls": calls}))
"""


def _counting_summarizer() -> tuple[LLMSummarizer, list[int]]:
    """A non-deterministic ``complete``: every call answers with the next number."""
    numbers, calls = itertools.count(1), []

    def complete(prompt: str) -> str:
        calls.append(next(numbers))
        return summary_answer(prompt, calls[-1])

    return LLMSummarizer(complete, TokenCounter()), calls


def test_llm_summaries_render_identically_after_a_reload_in_a_fresh_process(
    big_vault: Path, backend: Backend
) -> None:
    summarizer, calls = _counting_summarizer()
    conv = Conversation(
        "Be terse.", vault=big_vault, budget=SUMMARIZING, summarizer=summarizer
    )
    with backend.open() as store:
        store.create(ConversationInfo("c"))
        run_saved(parse_script({"turns": TURNS[:3]}), conv, store, "c")
    assert calls == [1]
    expected = openai_messages(conv.turn("q4", [{"note": "big.md"}]))
    assert calls == [1]  # the uninterrupted turn 4 reuses turn 3's summary
    assert any("Summary number 1 of the text." in m["content"] for m in expected)
    out = subprocess.run(
        [sys.executable, "-c", _RESUME, backend.value, str(big_vault)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    resumed = json.loads(out.stdout)
    assert resumed["calls"] == []
    assert json.dumps(resumed["messages"]) == json.dumps(expected)


def test_summaries_are_saved_in_the_same_transaction_as_their_turn(
    backend: Backend, big_vault: Path
) -> None:
    summarizer, _ = _counting_summarizer()
    conv = Conversation(vault=big_vault, budget=SUMMARIZING, summarizer=summarizer)
    with backend.open() as store:
        store.create(ConversationInfo("c"))
        run_saved(parse_script({"turns": TURNS[:1]}), conv, store, "c")
        conv.turn("q2", [{"note": "other.md"}])
        ((key, result),) = made = conv.summaries.unsaved()
        with pytest.raises(StoreError):  # a failed save writes neither the turn nor its summary
            save_turn(store, "missing", conv)
        assert store.get_summary(*key) is None
        assert conv.summaries.unsaved() == made
        save_turn(store, "c", conv)
        assert store.get_summary(*key) == result
        assert conv.summaries.unsaved() == ()
    assert result.text.startswith("Summary number 1 of the text.")


def test_a_conversation_outliving_its_store_still_summarizes(
    backend: Backend, big_vault: Path
) -> None:
    """Once the store is closed the memo stops reading it instead of failing the turn."""
    summarizer, calls = _counting_summarizer()
    conv = Conversation(vault=big_vault, budget=SUMMARIZING, summarizer=summarizer)
    with backend.open() as store:
        store.create(ConversationInfo("c"))
        run_saved(parse_script({"turns": TURNS[:1]}), conv, store, "c")
    env = conv.turn("q2", [{"note": "other.md"}])
    assert calls == [1] and "Summary number 1 of the text." in env.system_text
    with pytest.raises(StoreError, match="closed"):
        save_turn(store, "c", conv)
