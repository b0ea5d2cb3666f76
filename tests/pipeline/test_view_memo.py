"""The preview memo: bounded, least recently used first to go, and sized to what a turn
needs, so a warm rebuild of a large folder turn finds every preview it fitted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lamina import Conversation
from lamina.pipeline import Budget
from lamina.pipeline._views.preview import Preview
from lamina.pipeline.views import ViewMemo, shared_views
from tests.conftest import write_vault


def test_reserve_grows_up_to_max_size_and_never_shrinks() -> None:
    memo = ViewMemo(size=4, max_size=10)
    memo.reserve(6)
    assert memo.size == 6
    memo.reserve(3)
    assert memo.size == 6
    memo.reserve(50)
    assert memo.size == 10
    fixed = ViewMemo(size=4)
    fixed.reserve(50)
    assert fixed.size == 4


def test_entries_past_size_go_least_recently_used_first_and_made_counts_them() -> None:
    memo = ViewMemo(size=2)
    for key in ("a", "b", "a", "c"):  # "a" used again, so "b" is the oldest when "c" comes
        memo.get(key, lambda k=key: k.upper())
    assert (memo.made, memo.hits) == (3, 1)
    assert memo.get("b", lambda: "again") == "again"
    assert memo.get("a", lambda: "gone") == "gone"  # "c" and "b" were newer


def test_a_previews_text_counts_against_the_character_bound() -> None:
    memo = ViewMemo(size=100, max_chars=25)
    for i in range(3):
        memo.get(i, lambda: Preview("x" * 10, 1, 1, False))
    assert memo.chars == 20 and memo.get(0, lambda: Preview("new", 1, 1, False)).text == "new"


def test_the_shared_memo_is_bounded() -> None:
    memo = shared_views()
    assert memo.size >= 1024 and memo.max_size == 16_384 and memo.max_chars == 16_000_000


@pytest.fixture
def small_shared_memo() -> Iterator[ViewMemo]:
    """The shared memo held small, as a 1,600-note turn meets 1,024 entries; emptied
    first, so what earlier tests in this process left (same contents, same keys) is no
    hit here."""
    memo = shared_views()
    size, max_size = memo.size, memo.max_size
    memo.clear()
    memo.size = 8
    try:
        yield memo
    finally:
        memo.size, memo.max_size = size, max_size
        memo.clear()


def _folder(tmp_path: Path, notes: int) -> Path:
    part = "The sync engine queues writes. " * 30
    body = "\n\n".join(f"## Part {j}\n\n{part}" for j in range(6))
    return write_vault(
        tmp_path / "vault", {f"folder/n{i:02d}.md": f"# Note {i}\n\n{body}" for i in range(notes)}
    )


def _turn(vault: Path) -> int:
    """A new conversation's turn over the folder (a stateless rebuild): its memo hits.

    ``background=False``: the turn's promotion does not prepare the library's views on a
    thread, whose memo hits would otherwise land in whichever turn's meter is open."""
    conv = Conversation("You are terse.", vault=vault, budget=Budget(6000, 1000))
    env = conv.turn(
        "What do these notes say about the sync engine?", [{"folder": "folder"}], background=False
    )
    assert any(s.form == "preview" for s in env.l3.segments)
    return dict(env.report.meters)["view_memo_hits"]


def test_a_warm_rebuild_of_a_turn_larger_than_the_memo_finds_every_preview(
    tmp_path: Path, small_shared_memo: ViewMemo
) -> None:
    """Before, least recently used evicted each preview just before the rebuild asked for
    it (no hit at all); now the memo makes room for the turn's items twice over first, and
    a rebuild finds at least one view per note."""
    vault = _folder(tmp_path, 20)
    made = small_shared_memo.made
    _turn(vault)
    made = small_shared_memo.made - made
    assert made >= 20 and small_shared_memo.size >= 2 * made
    # The warm turn finds the 20 notes' views; the objective also tries fitted sizes the
    # cold turn did not (each solve sizes previews to the room it is given).
    assert _turn(vault) >= 20


def test_held_at_its_size_the_memo_thrashes(tmp_path: Path, small_shared_memo: ViewMemo) -> None:
    """The comparator: a memo that may not grow finds few of the turn's previews again."""
    small_shared_memo.max_size = 0
    vault = _folder(tmp_path, 20)
    made = small_shared_memo.made
    _turn(vault)
    made = small_shared_memo.made - made
    assert _turn(vault) < made // 4
