"""The renderer's memo: bounded in entries and characters, and sized to what a turn
renders, so a large folder turn's promotion finds the blocks L3 rendered instead of
rendering them again; the requests are the same either way."""

from __future__ import annotations

from pathlib import Path

from benchmarks.budget_fit import SEED, folder_workload
from lamina import Conversation
from lamina.pipeline import Budget, Envelope, Form, View
from lamina.pipeline._views.views import renderer_memo
from lamina.pipeline.views import ViewMemo
from lamina.renderers import XmlRenderer
from tests.conftest import write_vault

QUERY = "What do these notes say about the sync protocol?"


def _view(body: str) -> View:
    return View(
        key="note:docs/a.md",
        source_type="note",
        form=Form.FULL,
        title="A",
        locator="docs/a.md",
        recoverable=True,
        content_hash="0" * 32,
        attributes=(("path", "docs/a.md"),),
        body=body,
    )


class _Plain:
    """A renderer without a memo."""

    def render(self, view: View) -> str:
        return f"[{view.key}]\n{view.body}"


def test_the_xml_memo_starts_at_4096_and_grows_to_16384_entries_at_most() -> None:
    memo = XmlRenderer().memo
    assert (memo.size, memo.max_size, memo.max_chars) == (4096, 16_384, 16 << 20)
    memo.reserve(9_600)
    assert memo.size == 9_600
    memo.reserve(100_000)
    assert memo.size == 16_384
    memo.reserve(10)
    assert memo.size == 16_384


def test_renderer_memo_is_the_xml_renderers_memo_and_none_without_one() -> None:
    xml = XmlRenderer()
    assert renderer_memo(xml) is xml.memo
    assert renderer_memo(_Plain()) is None


def test_a_grown_memo_still_holds_at_most_its_characters() -> None:
    renderer = XmlRenderer(memo_size=2, memo_chars=2_000)
    renderer.memo.reserve(100)
    big = [renderer.render(_view(f"body {i} " * 100)) for i in range(5)]  # ~800 chars each
    assert renderer.memo.size == 100 and renderer.memo.chars <= 2_000
    assert renderer.render(_view("body 4 " * 100)) is big[4]
    assert renderer.render(_view("body 0 " * 100)) is not big[0]


def test_a_conversation_without_a_renderer_memo_meters_no_hits(tmp_path: Path) -> None:
    vault = write_vault(tmp_path / "vault", {"a.md": "# A\n\nSome text."})
    conv = Conversation("You are terse.", vault=vault, renderer=_Plain())
    env = conv.turn("What?", [{"note": "a.md"}])
    assert dict(env.report.meters)["render_memo_hits"] == 0
    assert "[note:a.md]\n" in env.user_text


def _texts(env: Envelope) -> tuple[str, ...]:
    return (env.system_text, env.user_text, *(layer.hash for layer in env.layers))


def _folder_turn(
    vault: Path, fixed: bool, held: list[int]
) -> tuple[ViewMemo, int, int, tuple[str, ...]]:
    """A new conversation's folder turn at 200k and its promotion: the renderer's memo,
    the entries the turn made, the promotion's hits, and the texts of the turn and the
    next one. ``fixed`` holds the memo at its starting 4,096 entries (the comparator);
    ``held`` gets the entries the memo holds after the folder turn.

    ``background=False``: the promotion is made when the library is read, not on a thread
    whose hits would land in the next turn's meter."""
    conv = Conversation("You are terse.", vault=vault, budget=Budget(200_000, 25_000))
    memo = renderer_memo(conv.renderer)
    assert memo is not None
    if fixed:
        memo.max_size = 0
    env = conv.turn(QUERY, [{"folder": "folder"}], background=False)
    made, hits = memo.made, memo.hits
    held.append(len(memo._items))
    _ = conv.library
    again = memo.made - made  # the full blocks the promotion rendered again
    assert again == 0 if not fixed else again > 1500
    promotion_hits = memo.hits - hits
    conv.reply("They say several things about it.")
    later = conv.turn("And in short?", background=False)
    return memo, made, promotion_hits, (*_texts(env), *_texts(later))


def test_a_1600_note_turns_promotion_finds_every_rendering(tmp_path: Path) -> None:
    """Sized to the turn (the memo grows to twice what the build renders), the promotion
    renders nothing again and finds its blocks; held at 4,096 entries it renders nearly
    all 1,600 full blocks again (least recently used had evicted them). The requests are
    byte-identical."""
    vault = tmp_path / "vault"
    write_vault(vault, folder_workload(SEED, 1600))
    held: list[int] = []
    memo, made, hits, texts = _folder_turn(vault, fixed=False, held=held)
    assert made >= 4800 and memo.size >= made and held[0] == made
    assert hits >= 1600
    fixed, _, fixed_hits, fixed_texts = _folder_turn(vault, fixed=True, held=[])
    assert fixed.size == 4096 and fixed_hits < hits
    assert texts == fixed_texts
