"""Index blocks: groups that do not fit are listed, one line an item, with sizes in full."""

from __future__ import annotations

import random
import re
from pathlib import Path

from lamina import Conversation
from pipeline import Budget, Envelope, Form, check_envelope
from pipeline._budget.index import IndexLine, index_artifact, is_omitted_only
from pipeline._views.views import full_view
from processors import folder
from renderers import XmlRenderer
from tests.pipeline.test_budget import exact_request_tokens

_LINE = re.compile(r"^- (\S+)")
_EMBED = re.compile(r"(note:\S+) \(\d+ tokens\)")


def _render(lines: list[IndexLine], unlisted: int = 0, where: str = "attached") -> str:
    artifact = index_artifact("folder:docs", lines, unlisted, where)  # type: ignore[arg-type]
    return XmlRenderer().render(full_view(artifact))


def test_an_index_block_lists_key_title_and_full_size() -> None:
    text = _render(
        [
            IndexLine("note:docs/setup.md", "Setting up", 804),
            IndexLine("note:docs/api.md", "api", 1210),
            IndexLine("note:docs/faq.md", "faq"),
        ]
    )
    assert text == (
        '<index key="index:folder:docs" title="index of folder:docs" items="3">\n'
        "3 items of folder:docs were attached but not sent for lack of room; each line gives "
        "key, title and size in full. Ask for one by its key to have it sent.\n"
        "- note:docs/setup.md | Setting up | 804 tokens\n"
        "- note:docs/api.md | 1210 tokens\n"
        "- note:docs/faq.md\n"
        "</index>"
    )


def test_an_embedded_section_joins_its_notes_line() -> None:
    line = IndexLine(
        "note:docs/guide.md",
        "guide",
        950,
        (("note:docs/shared.md#Install", 120), ("note:docs/shared.md#Upgrade", 88)),
    )
    assert line.render() == (
        "- note:docs/guide.md | 950 tokens | embeds note:docs/shared.md#Install (120 tokens), "
        "note:docs/shared.md#Upgrade (88 tokens)"
    )
    assert '<index key="index:folder:docs" title="index of folder:docs" items="3">' in _render(
        [line]
    )


def test_an_index_that_leaves_lines_out_says_how_many() -> None:
    text = _render([IndexLine("note:docs/a.md", "a", 10)], unlisted=41)
    assert text == (
        '<index key="index:folder:docs" title="index of folder:docs" items="42">\n'
        "42 items of folder:docs were attached but not sent for lack of room; each line gives "
        "key, title and size in full. Ask for one by its key to have it sent.\n"
        "- note:docs/a.md | 10 tokens\n"
        "[... 41 more items of folder:docs not listed ...]\n"
        "</index>"
    )


def test_a_library_index_says_its_items_were_set_aside() -> None:
    text = _render([IndexLine("note:docs/a.md", "Alpha", 300)], where="library")
    assert text == (
        '<index key="index:folder:docs" title="index of folder:docs" items="1">\n'
        "1 items of folder:docs were in the library and were set aside for room; each line "
        "gives key, title and size in full. Ask for one by its key to have it sent.\n"
        "- note:docs/a.md | Alpha | 300 tokens\n"
        "</index>"
    )


def test_omitted_only_bodies_are_recognized() -> None:
    assert is_omitted_only("[... 1 more section omitted ...]")
    assert is_omitted_only("[... 12 more sections omitted ...]\n")
    assert not is_omitted_only("# Title\n\n[... 1 more section omitted ...]")


def _embedding_vault(root: Path, notes: int, seed: int = 3) -> None:
    """``docs/``: notes of a few sections, each embedding two sections of ``shared/``."""
    rng = random.Random(seed)
    (root / "docs").mkdir()
    (root / "shared").mkdir()
    for s in range(20):
        parts = [f"# Shared {s}"]
        for p in range(4):
            words = " ".join(f"s{s}p{p}w{k}." for k in range(rng.randint(30, 90)))
            parts.append(f"## Part {p}\n\n{words}")
        (root / "shared" / f"shared-{s:02d}.md").write_text("\n\n".join(parts) + "\n")
    for i in range(notes):
        parts = [f"# Doc {i}"]
        for p in range(rng.randint(2, 5)):
            words = " ".join(f"d{i}p{p}w{k}." for k in range(rng.randint(40, 160)))
            parts.append(f"## Topic {p}\n\n{words}")
        for _ in range(2):
            parts.append(f"![[shared-{rng.randrange(20):02d}#Part {rng.randrange(4)}]]")
        (root / "docs" / f"doc-{i:03d}.md").write_text("\n\n".join(parts) + "\n")


def _findable(env: Envelope) -> set[str]:
    """Keys sent as blocks (full or preview) or listed on an index line."""
    found = {s.key for s in env.l3.segments if s.form in (Form.FULL, Form.PREVIEW)}
    for seg in env.l3.segments:
        if seg.source_type != "index":
            continue
        for line in seg.text.split("\n"):
            if m := _LINE.match(line):
                found.add(m.group(1))
                found.update(_EMBED.findall(line.partition(" | embeds ")[2]))
    return found


def test_a_folder_with_embeds_sends_no_empty_block_and_every_note_is_findable(
    tmp_path: Path,
) -> None:
    """A folder far over the window: no block holds only an omitted-sections line, and
    every note and embedded section is sent or listed (embeds on their note's line)."""
    _embedding_vault(tmp_path, 300)
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(8_000, 1_000))
    env = conv.turn("What do the docs say?", [folder("docs")])
    check_envelope(env)
    assert exact_request_tokens(env) <= 7_000
    for seg in env.l3.segments:
        body = seg.text.split("\n")[1:-1]
        assert not (seg.form is Form.PREVIEW and is_omitted_only("\n".join(body))), seg.text
    indexes = {s.key for s in env.l3.segments if s.source_type == "index"}
    assert set(env.report.attached) - indexes <= _findable(env)
    docs = {f"note:docs/doc-{i:03d}.md" for i in range(300)}
    assert docs <= _findable(env)
    index = next(s for s in env.l3.segments if s.source_type == "index")
    assert " | embeds note:shared/" in index.text


def test_index_lines_give_the_full_size(tmp_path: Path) -> None:
    """Each line's size is the item's full block, not the size it was cut to."""
    _embedding_vault(tmp_path, 300)
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(8_000, 1_000))
    env = conv.turn("What do the docs say?", [folder("docs")])
    index = next(s for s in env.l3.segments if s.source_type == "index")
    line = next(x for x in index.text.split("\n") if x.startswith("- note:docs/doc-299.md"))
    size = int(re.search(r" \| (\d+) tokens", line).group(1))  # type: ignore[union-attr]
    whole = Conversation("You are terse.", vault=tmp_path)
    full = whole.turn("Read it.", [{"note": "docs/doc-299.md"}]).l3.get("note:docs/doc-299.md")
    assert full is not None and full.form is Form.FULL and size == full.tokens
