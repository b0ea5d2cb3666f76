"""Real-material checks: whole budgeted chats over examples/vault and a public vault
(kepano/kepano-obsidian, MIT, in tests/data), judged by ``lamina.renderers.judge_chat``, whose
criteria are fixed (none read from the budget's settings), against the project's
targets: window use >= 90% in the turns that cut (>= 85% in a single large-folder turn), a
cached-prefix share of at least 80% of the chat's bound (only what each turn adds
uncached), nothing left cut (an entry shown only cut whose full form fits the request's
free room less 5% of the limit), stubs plus index blocks <= 10% of the window, no block
without prose, no open frontmatter, never over the limit, no reference to a stub.

Larger vaults (thousands of notes, tags, many languages) are measured by
``benchmarks/real_material.py`` on vaults fetched outside the repository.

A target main does not meet yet is marked ``xfail(strict=False)`` with the value
measured when it was written; drop the mark once the budget meets it."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from lamina import Conversation, load_script, run_script
from lamina.pipeline import Budget, Envelope
from lamina.renderers import ChatJudgement, ChatTargets, judge_chat

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "vault"
KEPANO = ROOT / "tests" / "data" / "kepano-obsidian"
TARGETS = ChatTargets()
FOLDER_USE = 0.85

Turn = tuple[str, list[dict[str, str]]]

# The small case: the spec, the API notes, the spec again, a short question, then the spec
# re-attached with two other notes (window 3,000, reserve 400).
SMALL: list[Turn] = [
    ("Summarize the spec.", [{"note": "project-spec.md"}]),
    ("And the API?", [{"note": "docs/api-docs.md"}]),
    ("The spec again, please.", [{"note": "project-spec.md"}]),
    ("A short question: who owns M3?", []),
    (
        "Compare these three.",
        [{"note": "project-spec.md"}, {"note": "docs/auth.md"}, {"note": "glossary.md"}],
    ),
]
_FOLDERS = ("Categories", "Clippings", "Daily", "Notes", "References", "Templates")
# A documentation-vault chat: a folder a turn, then questions, one re-attaching a long note.
KEPANO_CHAT: list[Turn] = [
    (f"Question {i + 1}: what do these notes say about {_FOLDERS[i % 6]}?", attach)
    for i, attach in enumerate(
        [[{"folder": f}] for f in _FOLDERS]
        + [
            [{"note": "Clippings/68 Bits of Unsolicited Advice.md"}] if i % 4 == 0 else []
            for i in range(6, 14)
        ]
    )
]


def _chat(vault: Path, turns: list[Turn], window: int, reserve: int) -> Callable[[], Judged]:
    def run() -> Judged:
        conv = Conversation(
            "You answer from the attached notes.",
            vault=vault,
            budget=Budget(context_window=window, reserve_output=reserve),
        )
        envs: list[Envelope] = []
        for i, (query, attach) in enumerate(turns):
            envs.append(conv.turn(query, attach))
            conv.reply(f"Answer {i + 1}: " + "the notes say several things about this. " * 8)
        return envs, judge_chat(envs, conv.counter, budget=conv.budget)

    return run


def _chat30() -> Judged:
    script = load_script(ROOT / "examples" / "chat30.yaml")
    conv = Conversation(
        script.system, vault=script.vault, budget=Budget(context_window=6000, reserve_output=1500)
    )
    envs = run_script(script, conv)
    return envs, judge_chat(envs, conv.counter, budget=conv.budget)


Judged = tuple[list[Envelope], ChatJudgement]
CHATS: dict[str, Callable[[], Judged]] = {
    "small-3000": _chat(EXAMPLES, SMALL, 3000, 400),
    "chat30-6000": _chat30,
    "kepano-16k": _chat(KEPANO, KEPANO_CHAT, 16000, 2000),
    "kepano-8k": _chat(KEPANO, KEPANO_CHAT, 8000, 1000),
    "kepano-4k": _chat(KEPANO, KEPANO_CHAT, 4000, 600),
    # One turn attaching the vault's largest folder (52 templates) in a window it overflows.
    "kepano-folder-2k": _chat(
        KEPANO, [("What are these templates for?", [{"folder": "Templates"}])], 2000, 400
    ),
}
FOLDER_CHATS = ("kepano-folder-2k",)
"""Single large-folder turns: their window-use target is 85%, not 90%."""

# Measured on main's budget (f806add) by the fixed judge, with the views' text-free fixes
# (in brackets: with main's views, before them). Under the judge before (left cut beyond
# the plan's slack, a 60% cached share on three chats) every chat met every target. With
# main's views, 50 blocks left frontmatter open at 4k, 3 at 8k and 4 in the folder turn.
# After "the objective": the values each entry ends with; the cache a change loses priced
# at 0.7 with the regret (solver.solve) met kepano-8k's share and left nothing cut in chat30;
# priced as what the previous request sent (and the shed, the fold rule), kepano-4k's.
# With the price at the provider's discount (0.9, from 0.7), small-3000 keeps its spec whole
# and caches 93% of its bound (43% before: turn 4 gave docs/api-docs.md back whole, its
# full form fitting, and turn 5's three new notes cut it again).
_NOT_YET: dict[tuple[str, str], str] = {}


@cache
def _run(name: str) -> Judged:
    return CHATS[name]()


def judged(name: str) -> ChatJudgement:
    return _run(name)[1]


def _marks(name: str, check: str) -> Any:
    """An xfail naming main's measured value, for a target main does not meet yet."""
    if (name, check) not in _NOT_YET:
        return ()
    return pytest.mark.xfail(strict=False, reason=f"measured {_NOT_YET[name, check]}")


def _cases(check: str) -> list[Any]:
    return [pytest.param(name, marks=_marks(name, check), id=name) for name in CHATS]


@pytest.mark.parametrize("name", _cases("window_use"))
def test_window_is_used_in_turns_that_cut(name: str) -> None:
    j = judged(name)
    target = FOLDER_USE if name in FOLDER_CHATS else TARGETS.window_use
    assert j.cut_turns == 0 or j.window_use >= target, j.summary()


def test_the_single_folder_turn_cuts() -> None:
    """The large-folder chat is a turn that cuts, so its window-use target is tested."""
    assert all(judged(name).cut_turns == 1 for name in FOLDER_CHATS)


@pytest.mark.parametrize("name", _cases("cached_share"))
def test_cached_prefix_share_is_at_least_80pc_of_its_bound(name: str) -> None:
    j = judged(name)
    assert j.cached_of_bound >= TARGETS.cached_of_bound, j.summary()


FINDINGS = ("left-cut", "no-prose", "open-frontmatter", "over-limit", "stub-reference")


@pytest.mark.parametrize(
    ("name", "check"),
    [
        pytest.param(name, check, marks=_marks(name, check), id=f"{name}-{check}")
        for check in FINDINGS
        for name in CHATS
    ],
)
def test_no_finding(name: str, check: str) -> None:
    """Nothing left cut while its full form fits, no block without prose, no frontmatter
    left open, no request over the limit, no reference to a stub."""
    j = judged(name)
    assert j.count(check) == 0, [f for f in j.findings if f.check == check][:5]


@pytest.mark.parametrize("name", _cases("text_free"))
def test_stubs_and_indexes_stay_a_small_share_of_the_window(name: str) -> None:
    j = judged(name)
    assert j.text_free_share <= TARGETS.text_free_share, j.summary()


@pytest.mark.parametrize("name", list(CHATS))
def test_the_cache_forgone_is_summed_by_how_each_request_was_sent(name: str) -> None:
    """What the bound leaves uncached, split by each request's batch reason after the
    first (``ChatJudgement.forgone``): the parts make up the whole, the largest first."""
    envs, j = _run(name)
    how = {e.batch.reason or "extended" for e in envs[1:] if e.batch is not None}
    assert {k for k, _ in j.forgone} == how
    assert sum(n for _, n in j.forgone) == j.bound_tokens - j.cached_tokens
    assert [n for _, n in j.forgone] == sorted((n for _, n in j.forgone), reverse=True)


def test_the_public_vault_is_small_and_licensed() -> None:
    """Only notes and the MIT licence are committed, under 2 MB."""
    files = [p for p in KEPANO.rglob("*") if p.is_file()]
    assert (KEPANO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert {p.suffix for p in files} == {".md", ""}
    assert sum(p.stat().st_size for p in files) < 2_000_000
