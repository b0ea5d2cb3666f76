"""Warm turns reuse what did not change: measured as characters sent to the tokenizer."""

from __future__ import annotations

from pathlib import Path

from pipeline import Conversation
from processors import note


def _note(i: int) -> str:
    sections = "\n\n".join(
        f"## Part {s}\n\n"
        + " ".join(f"Sample {i}.{s}.{k} was logged in store {k}." for k in range(12))
        for s in range(3)
    )
    return f"# Note {i}\n\n{sections}\n"


def _vault(root: Path, n: int) -> Path:
    for i in range(n):
        (root / f"n{i:03d}.md").write_text(_note(i), encoding="utf-8")
    return root


def _warm_turn(conv: Conversation, i: int) -> tuple[int, int]:
    """Encoded characters of one turn adding note i, and the new text it brought."""
    before = conv.counter.encoded_chars
    query = f"what about note {i}?"
    env = conv.turn(query, attach=[note(f"n{i:03d}.md")])
    conv.reply(f"note {i} is fine")
    new_block = env.l3.segments[-1].text
    return conv.counter.encoded_chars - before, len(new_block) + len(query)


def test_a_warm_turn_encodes_only_the_new_note_and_framing(tmp_path: Path) -> None:
    conv = Conversation("You are terse.", vault=_vault(tmp_path, 60))
    conv.turn("load", attach=[note(f"n{i:03d}.md") for i in range(50)])
    conv.reply("loaded")
    conv.turn("settle")  # promotes the 50 notes into L2
    conv.reply("ok")
    encoded, new = _warm_turn(conv, 50)
    # The new note's block and the query, plus the previous reply (now history) and a few
    # short tails at block boundaries: never the 50-entry library again.
    library_chars = len(conv.library.layer(conv.counter).text)
    assert encoded <= new + 300, (encoded, new)
    assert encoded < library_chars / 10


def test_turn_200_costs_no_more_than_turn_20(tmp_path: Path) -> None:
    conv = Conversation("You are terse.", vault=_vault(tmp_path, 200))
    costs: dict[int, tuple[int, int]] = {}
    for i in range(200):
        costs[i] = _warm_turn(conv, i)
    (enc20, new20), (enc199, new199) = costs[20], costs[199]
    # Work per turn follows what is new in the turn, not the 200 turns before it.
    assert enc199 <= enc20 * (new199 / new20) * 1.1 + 100, (costs[20], costs[199])
