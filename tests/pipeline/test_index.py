"""Index blocks: groups that do not fit are listed, one line an item, with sizes in full."""

from __future__ import annotations

import random
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina import Conversation
from lamina.pipeline import Budget, Envelope, Form, Segment, check_envelope
from lamina.pipeline._budget.index import IndexLine, index_artifact, is_omitted_only
from lamina.pipeline._budget.stubs import SET_ASIDE
from lamina.pipeline._views.views import full_view
from lamina.processors import folder
from lamina.renderers import XmlRenderer
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


def test_a_library_index_over_its_share_keeps_only_its_count() -> None:
    text = _render([], unlisted=173, where="library")
    assert text == (
        '<index key="index:folder:docs" title="index of folder:docs" items="173">\n'
        "173 items of folder:docs were in the library and were set aside for room; they are "
        "not listed here. Ask for one by its key, or for the folder again, to have it sent.\n"
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


def _counted(env: Envelope) -> int:
    """Items this turn's index blocks count without listing them (``items`` less the
    lines and the embeds on them)."""
    total = 0
    for seg in env.l3.segments:
        if seg.source_type != "index":
            continue
        lines = [x for x in seg.text.split("\n") if _LINE.match(x)]
        embeds = sum(len(_EMBED.findall(x.partition(" | embeds ")[2])) for x in lines)
        total += int(dict(seg.attributes)["items"]) - len(lines) - embeds
    return total


def _text_free(env: Envelope) -> int:
    """Tokens of the request's blocks without prose: index blocks and references."""
    return sum(
        s.tokens
        for s in (*env.l2.segments, *env.l3.segments)
        if s.form is Form.REFERENCE or s.source_type == "index"
    )


def _accounted(env: Envelope, keys: set[str]) -> None:
    """Each of ``keys`` (attached this turn) is sent or listed, or counted in its group's
    index: the indexes count at least as many as are neither sent nor listed (they count
    embedded sections too)."""
    assert len(keys - _findable(env)) <= _counted(env), (len(keys - _findable(env)), _counted(env))


def test_a_folder_with_embeds_sends_no_empty_block_and_every_note_is_accounted_for(
    tmp_path: Path,
) -> None:
    """A folder far over the window: no block holds only an omitted-sections line; every
    note and embedded section is sent, listed (embeds on their note's line) or counted in
    the folder's index; the lines stay within the text-free share (10% of the window)."""
    _embedding_vault(tmp_path, 300)
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(8_000, 1_000))
    env = conv.turn("What do the docs say?", [folder("docs")])
    check_envelope(env)
    assert exact_request_tokens(env) <= 7_000
    assert not any(_empty_block(s) for s in env.l3.segments)
    docs = {f"note:docs/doc-{i:03d}.md" for i in range(300)}
    _accounted(env, docs)
    assert _counted(env) > 0 and _text_free(env) <= 800
    index = env.l3.get("index:folder:docs")
    assert index is not None
    assert f"[... {_counted(env)} more items of folder:docs not listed ...]" in index.text


def test_index_lines_give_the_full_size(tmp_path: Path) -> None:
    """Each line's size is the item's full block, not the size it was cut to."""
    _embedding_vault(tmp_path, 300)
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(8_000, 1_000))
    env = conv.turn("What do the docs say?", [folder("docs")])
    index = next(s for s in env.l3.segments if s.source_type == "index")
    line = [x for x in index.text.split("\n") if x.startswith("- note:docs/")][-1]
    key = line.removeprefix("- ").split(" ")[0]
    size = int(re.search(r" \| (\d+) tokens", line).group(1))  # type: ignore[union-attr]
    whole = Conversation("You are terse.", vault=tmp_path)
    full = whole.turn("Read it.", [{"note": key.removeprefix("note:")}]).l3.get(key)
    assert full is not None and full.form is Form.FULL and size == full.tokens


def _folders_vault(root: Path, folders: int, notes: int, seed: int = 11) -> None:
    """``folders`` folders ``f00``.. of ``notes`` generated notes each (0.5-3 KB)."""
    from benchmarks.workload import make_note

    rng = random.Random(seed)
    for f in range(folders):
        (root / f"f{f:02d}").mkdir()
        for i in range(notes):
            text = make_note(rng, rng.randint(500, 3000), f"Note {f}.{i}")
            (root / f"f{f:02d}" / f"note-{i:03d}.md").write_text(text, encoding="utf-8")


def _stub_tokens(env: Envelope) -> int:
    return sum(
        s.tokens for s in env.l2.segments if s.form is Form.REFERENCE or s.source_type == "index"
    )


def test_a_folder_a_turn_for_16_turns_keeps_stubs_under_a_tenth_of_the_window(
    tmp_path: Path,
) -> None:
    """One 173-note folder attached a turn at 32k: every turn completes (it failed at turn 6
    when 456 stubs took 24,745 of 28,000 tokens) and stubs stay within 10% of the window."""
    _folders_vault(tmp_path, 16, 173)
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(32_000, 4_000))
    previous = None
    for f in range(16):
        env = conv.turn(f"What is in folder {f}?", [folder(f"f{f:02d}")])
        check_envelope(env, previous)
        assert _stub_tokens(env) <= 3_200, (f, _stub_tokens(env))
        _accounted(env, {f"note:f{f:02d}/note-{i:03d}.md" for i in range(173)})
        assert _text_free(env) <= 3_200, (f, _text_free(env))
        conv.reply("Noted.")
        previous = env
    indexes = [s.key.split("@")[0] for s in env.l2.segments if s.source_type == "index"]
    # Lines go to their folder's indexes, counts to the library's count blocks (SET_ASIDE);
    # a fold that changes nothing before its first entry starts a block beside an earlier
    # one of its group, keyed ``@<turn>``.
    assert indexes and all(
        k.startswith("index:folder:f") or k == f"index:{SET_ASIDE}" for k in indexes
    )


def test_a_re_attached_folder_counts_its_references_within_the_share(tmp_path: Path) -> None:
    """A folder of 120 one-line notes the library holds whole, attached again: its members
    are references to their entries, text-free like any stub, so the share (800 tokens of
    an 8,000 window) bounds them and the rest are counted in the folder's index. Before,
    the references could not be counted: 3,510 tokens of them, and the library cut to 2,850
    tokens of its 4,560 to make room for references pointing at it."""
    (tmp_path / "notes").mkdir()
    for i in range(120):
        text = f"Fact {i}: the river town keeps {i} boats.\n"
        (tmp_path / "notes" / f"n{i:03d}.md").write_text(text, encoding="utf-8")
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(8_000, 1_000))
    first = conv.turn("What is in the notes?", [folder("notes")])
    assert {s.form for s in first.l3.segments} == {Form.FULL}
    conv.reply("Noted.")
    again = conv.turn("And again?", [folder("notes")])
    check_envelope(again, first)
    assert _text_free(again) <= 800, _text_free(again)
    assert again.l2.tokens == first.l3.tokens  # every note still whole in the library
    referenced = {s.key for s in again.l3.segments if s.form is Form.REFERENCE}
    assert len(referenced) + _counted(again) == 120  # each referenced or counted
    # The counted references are said to be in the conversation, not left out for room.
    index = again.l3.get("index:folder:notes")
    assert index is not None
    head = index.text.split("\n")[1]
    assert f"({_counted(again)} already in this conversation)" in head, head
    assert "for lack of room" not in index.text


def test_an_index_says_which_counted_items_are_already_in_the_conversation() -> None:
    """An index counting items not sent for room and items attached again says which is
    which; without the latter its head is as before."""
    line = IndexLine("note:docs/api.md", "API", 120)
    both = index_artifact("tag:#sync", (line,), unlisted=2, earlier=1)
    assert XmlRenderer().render(full_view(both)) == (
        '<index key="index:tag:#sync" title="index of tag:#sync" items="4">\n'
        "4 items of tag:#sync were attached but not sent here (1 already in this "
        "conversation, 3 for lack of room); each line gives key, title and size in full. "
        "Ask for one by its key to have it sent.\n"
        "- note:docs/api.md | API | 120 tokens\n"
        "[... 2 more items of tag:#sync not listed ...]\n"
        "</index>"
    )
    earlier = index_artifact("tag:#sync", (), earlier=3)
    assert earlier.payload.body() == (
        "3 items of tag:#sync were attached but not sent here (3 already in this "
        "conversation); they are not listed here. Ask for one by its key, or for the "
        "folder again, to have it sent."
    )
    plain = index_artifact("tag:#sync", (line,), unlisted=2)
    assert plain.payload.body().startswith(
        "3 items of tag:#sync were attached but not sent for lack of room; each line"
    )


def test_library_index_lines_give_the_full_size(tmp_path: Path) -> None:
    """A stub collapsed into the library's index keeps its entry's size in full."""
    _folders_vault(tmp_path, 3, 60)
    budget = Budget(12_000, 1_500)
    conv = Conversation("You are terse.", vault=tmp_path, budget=budget)
    for f in range(3):
        env = conv.turn(f"Folder {f}?", [folder(f"f{f:02d}")])
        conv.reply("Noted.")
    # The folder's lines may stand in a block a later fold started (``@<turn>``).
    index = next(
        s
        for s in env.l2.segments
        if s.key.split("@")[0] == "index:folder:f00" and "\n- note:f00/" in s.text
    )
    line = next(x for x in index.text.split("\n") if x.startswith("- note:f00/"))
    key = line.removeprefix("- ").split(" ")[0]
    size = int(re.search(r" \| (\d+) tokens", line).group(1))  # type: ignore[union-attr]
    whole = Conversation("You are terse.", vault=tmp_path)
    full = whole.turn("Read it.", [{"note": key.removeprefix("note:")}]).l3.get(key)
    assert full is not None and full.form is Form.FULL and size == full.tokens


def test_an_index_too_large_for_the_window_leaves_out_its_last_lines(tmp_path: Path) -> None:
    """300 notes in a 3,000-token window (their index lines alone would not fit): the
    index is never cut to a preview; each note is sent, listed, or counted in the index's
    count of what it does not list; the index is not carried into L2."""
    _folders_vault(tmp_path, 1, 300)
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(3_000, 400))
    env = conv.turn("What is in the folder?", [folder("f00")])
    check_envelope(env)
    index = env.l3.get("index:folder:f00")
    assert index is not None and index.form is Form.FULL
    listed = [m.group(1) for x in index.text.split("\n") if (m := _LINE.match(x))]
    assert listed == sorted(listed)
    sent = {s.key for s in env.l3.segments if s.key != index.key}
    assert sent.isdisjoint(listed)
    counted = int(dict(index.attributes)["items"]) - len(listed)
    assert len(listed) + len(sent) + counted == 300
    conv.reply("Noted.")
    assert "index:folder:f00" not in conv.library


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    notes=st.integers(min_value=4, max_value=60),
    window=st.integers(min_value=2_500, max_value=9_000),
    seed=st.integers(min_value=0, max_value=3),
)
def test_every_note_of_a_folder_is_sent_listed_or_counted(
    notes: int, window: int, seed: int
) -> None:
    """Whatever the folder's size and the window: the request fits, no block holds only
    an omitted-sections line, every note and embedded section is sent, listed or counted
    in the folder's index, and the lines stay within the text-free share."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _embedding_vault(root, notes, seed)
        conv = Conversation("You are terse.", vault=root, budget=Budget(window, window // 8))
        env = conv.turn("What do the docs say?", [folder("docs")])
    check_envelope(env)
    assert not any(_empty_block(s) for s in env.l3.segments)
    docs = {f"note:docs/doc-{i:03d}.md" for i in range(notes)}
    indexes = {s.key for s in env.l3.segments if s.source_type == "index"}
    _accounted(env, docs | (set(env.report.attached) - indexes))
    assert _text_free(env) <= window // 10 or _counted(env) == 0


def _empty_block(segment: Segment) -> bool:
    lines = segment.text.split("\n")
    return segment.form is Form.PREVIEW and is_omitted_only("\n".join(lines[1:-1]))
