"""Real-material checks: whole budgeted chats over examples/vault and a public vault
(kepano/kepano-obsidian, MIT, in tests/data), judged by ``lamina.renderers.judge_chat`` against
the project's targets: mean window use >= 90% in the turns that cut, cached-prefix share
>= 60% on the documentation-vault chats, no entry the model sees only cut while its full
form fits the room beyond the plan's slack (and none that the budget's restore schedule
gives back), no reference to a stub, no empty block, stubs <= 10% of the window.

A target main does not meet yet is marked ``xfail(strict=False)`` with the value
measured when it was written; drop the mark once the budget meets it."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from lamina import Conversation, load_script, run_script
from lamina.pipeline import Budget, Envelope
from lamina.renderers import ChatJudgement, ChatTargets, judge_chat

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "vault"
KEPANO = ROOT / "tests" / "data" / "kepano-obsidian"
TARGETS = ChatTargets()

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
}
# The cached-share target is for documentation chats with room (the small case attaches
# anew every turn in a 3,000-token window: nothing there can stay cached).
CACHED_CHATS = ("chat30-6000", "kepano-16k", "kepano-8k")

# Measured on main after the index collapse, the budget's restores, small entries folded
# into their group's index, last cuts sized to the need, re-attached cut entries restored
# in place, the slack sized from the conversation's growth and restores batched from 40%
# of the limit (or where the prefix breaks anyway). Earlier: before the index collapse
# kepano-8k stubs took 45.5% of the window and 695 turn-entries were left cut, kepano-4k
# stubs 58.3%; before the restores the small case left the spec a summary with 1,740
# tokens free; with a flat 20% slack, window use in the turns that cut was 89.1%
# (small), 87.0% (chat30), 78.9% (kepano-8k, whose turn 9 folded the library from 5,439
# to 427 tokens) and 89.7% (kepano-4k), with 53, 49 and 22 turn-entries left cut.
# "left_cut" counts any entry the model sees only cut (no full copy anywhere in the
# request as sent) while its full form fits what the request leaves free beyond the plan's
# slack; before restores by appending, with the judge reading requests as sent, it was 15
# (chat30) and 1 (kepano-8k) turn-entries; reading requests as built, 49, 19 and 1 (27
# and 16 at 8k and 4k before cuts saving under 16 tokens were refused). Those that fit
# only in the slack are counted apart ("in-slack": 4 / 11 / 1 turn-entries on chat30,
# kepano-8k and 4k; with no slack none, at 55.2%, 37.2% and 14.9% cached instead of
# 73.5%, 62.3% and 33.8%).
# With the library's growth deferred to the next prefix break (the default layout since),
# kepano-8k's cached share is 61.5% (49.3%).
_NOT_YET: dict[tuple[str, str], str] = {}


@cache
def judged(name: str) -> ChatJudgement:
    return CHATS[name]()[1]


def _cases(check: str, chats: tuple[str, ...] = tuple(CHATS)) -> list[object]:
    return [
        pytest.param(
            name,
            marks=pytest.mark.xfail(strict=False, reason=f"main measured {_NOT_YET[name, check]}")
            if (name, check) in _NOT_YET
            else (),
            id=name,
        )
        for name in chats
    ]


@pytest.mark.parametrize("name", _cases("window_use"))
def test_window_is_used_in_turns_that_cut(name: str) -> None:
    j = judged(name)
    assert j.cut_turns == 0 or j.window_use >= TARGETS.window_use, j.summary()


@pytest.mark.parametrize("name", _cases("cached_share", CACHED_CHATS))
def test_cached_prefix_share(name: str) -> None:
    j = judged(name)
    assert j.cached_share >= TARGETS.cached_share, j.summary()


@pytest.mark.parametrize("name", _cases("left_cut"))
def test_no_entry_left_cut_while_its_full_form_fits(name: str) -> None:
    j = judged(name)
    assert j.count("left-cut") == 0, [f for f in j.findings if f.check == "left-cut"][:5]


@pytest.mark.parametrize("name", _cases("restore_due"))
def test_no_entry_left_cut_that_the_restore_schedule_gives_back(name: str) -> None:
    """Of the entries left cut while their full form fits: none whose full form fits the
    headroom less the slack in a turn where the schedule restores (the prefix broke, or
    the restore gives back ``restore_min`` of the limit)."""
    j = judged(name)
    assert j.count("restore-due") == 0, [f for f in j.findings if f.check == "restore-due"][:5]


@pytest.mark.parametrize("name", _cases("stub_reference"))
def test_no_reference_to_a_stub(name: str) -> None:
    j = judged(name)
    assert j.count("stub-reference") == 0, j.findings


@pytest.mark.parametrize("name", _cases("empty_block"))
def test_no_empty_block(name: str) -> None:
    j = judged(name)
    assert j.count("empty-block") == 0, j.findings


@pytest.mark.parametrize("name", _cases("stub_share"))
def test_stubs_stay_a_small_share_of_the_window(name: str) -> None:
    j = judged(name)
    assert j.stub_share <= TARGETS.stub_share, j.summary()


def test_the_public_vault_is_small_and_licensed() -> None:
    """Only notes and the MIT licence are committed, under 2 MB."""
    files = [p for p in KEPANO.rglob("*") if p.is_file()]
    assert (KEPANO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert {p.suffix for p in files} == {".md", ""}
    assert sum(p.stat().st_size for p in files) < 2_000_000
