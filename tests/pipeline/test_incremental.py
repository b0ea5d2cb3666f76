"""Warm turns reuse what did not change: measured as characters sent to the tokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina import Conversation
from lamina.pipeline import AttachmentSpec, Budget, Form, Library, Policy
from lamina.pipeline.sources import Processed, make_artifact
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.views import carry_forward, full_view
from lamina.processors import NotePayload, Sources, note
from lamina.renderers import XmlRenderer
from tests.strategies import MARKDOWN_LINE


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


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(MARKDOWN_LINE, min_size=1, max_size=400))
def test_a_promoted_preview_is_counted_exactly_without_encoding_it(lines: list[str]) -> None:
    """A preview's L2 block is counted from its sections' counts; the count is the true one."""
    counter = TokenCounter()
    body = "\n".join(["# Note", "", *lines, *lines, *lines]) + "\n"
    artifact = make_artifact(
        "note", "note:n.md", NotePayload("n.md", "n", (), (), body, ()), recoverable=True
    )
    renderer = XmlRenderer()
    counter.count(renderer.render(full_view(artifact)))  # what L3 sent: counted already
    _, text = carry_forward(artifact, counter, Policy(), renderer)
    assert counter.count(text) == len(counter.encoding.encode_ordinary(text))


def test_promoting_a_large_note_encodes_its_preview_sections_not_its_l2_block(
    tmp_path: Path,
) -> None:
    conv = Conversation("You are terse.", vault=_vault(tmp_path, 1))
    (tmp_path / "big.md").write_text(_note(0) * 40, encoding="utf-8")
    conv.turn("read", attach=[note("big.md")])
    entry = conv.library.get("note:big.md")
    assert entry is not None and entry.form is Form.PREVIEW
    before = conv.counter.encoded_chars
    assert conv.counter.count(entry.text) == entry.tokens  # learned, not encoded
    assert conv.counter.encoded_chars == before
    assert entry.tokens == len(conv.counter.encoding.encode_ordinary(entry.text))


def test_a_preview_made_for_the_budget_is_reused_by_promotion(tmp_path: Path) -> None:
    (tmp_path / "big.md").write_text(_note(0) * 40, encoding="utf-8")
    # A fitted preview within the carry-forward size enters L2 as sent (a larger one
    # enters in carry-forward form: test_restore.py).
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(1_500, reserve_output=200))
    env = conv.turn("read", attach=[note("big.md")])
    assert [d.to_form for d in env.report.decisions if d.stage == "budget"] == ["preview"]
    entry = conv.library.get("note:big.md")
    # Promotion (after the turn, off its critical path) found the budget's preview.
    assert conv.views.hits >= 1
    assert entry is not None and entry.form is Form.PREVIEW
    assert entry.text == env.l3.get("note:big.md").text  # the one preview, in both layers


@attrs.define
class _HostResolver:
    """A host's own resolver: the three protocol methods and no ``for_turn``."""

    inner: Sources
    processed: list[str] = attrs.field(factory=list)

    def process(self, spec: AttachmentSpec) -> Processed:
        self.processed.append(spec.kind)
        return self.inner.process(spec)

    def with_changes(self, changes: Mapping[str, str]) -> _HostResolver:
        return _HostResolver(self.inner.with_changes(changes), self.processed)

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        return self.inner.parse(data)


def test_a_resolver_without_for_turn_is_used_as_it_is(tmp_path: Path) -> None:
    resolver = _HostResolver(Sources.for_vault(_vault(tmp_path, 2)))
    conv = Conversation("You are terse.", sources=resolver)
    env = conv.turn("read", attach=[note("n000.md"), {"note": "n001.md"}])
    assert resolver.processed == ["note", "note"]
    assert [s.key for s in env.l3.segments] == ["note:n000.md", "note:n001.md"]


def test_a_prefix_answers_for_the_library_asked_about(tmp_path: Path) -> None:
    """The conversation's rendered library is kept in a mutable ``LibraryPrefix``, never in
    the frozen ``Library``; asked about any library (grown, shrunk, with a block replaced),
    it gives that library's exact layer, as rendering it afresh does."""
    from lamina.pipeline._model.library import LibraryPrefix

    conv = Conversation("You are terse.", vault=_vault(tmp_path, 6))
    for i in range(6):
        _warm_turn(conv, i)
    conv.turn("settle")
    full = conv.library
    first = full.entries[0]
    shorter = attrs.evolve(first, text=first.text[:40], tokens=conv.counter.count(first.text[:40]))
    libraries = [
        Library(full.entries[:3]),
        full,
        full.replace(shorter),
        Library(full.entries[1:]),
        full,
    ]
    prefix, counter = LibraryPrefix(), conv.counter
    for library in libraries:
        fresh = Library(library.entries).layer(TokenCounter(counter.name))
        assert prefix.measure(library, counter) == (fresh.segments, fresh.tokens)
        layer = prefix.layer(library, counter)
        assert (layer.tokens, layer.hash, layer.text) == (fresh.tokens, fresh.hash, fresh.text)
    assert [f.name for f in attrs.fields(Library)] == ["entries", "_index"]


def test_a_turn_fitting_notes_to_previews_encodes_each_note_once(tmp_path: Path) -> None:
    """Notes that must be cut are counted at their sections, which the fitted previews then
    find: a cold turn encodes the notes' text about once, not once whole and again by
    section (twice before; measured 1.25x with the objective, which fits previews to
    several sizes)."""
    notes = [tmp_path / f"n{i}.md" for i in range(4)]
    for i, path in enumerate(notes):
        path.write_text(_note(i) * 3, encoding="utf-8")
    conv = Conversation("You are terse.", vault=tmp_path, budget=Budget(3_000, reserve_output=500))
    env = conv.turn("what was logged?", attach=[note(p.name) for p in notes])
    cuts = [d.to_form for d in env.report.decisions if d.stage == "budget"]
    assert cuts == ["preview"] * 4
    note_chars = sum(len(p.read_text(encoding="utf-8")) for p in notes)
    assert conv.counter.encoded_chars < 1.3 * note_chars
    enc = conv.counter.encoding
    for segment in env.l3.segments:  # the previews' counts, made from section counts
        assert segment.tokens == len(enc.encode_ordinary(segment.text))
    assert env.l3.tokens == len(enc.encode_ordinary(env.l3.text))


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(
        st.sampled_from(["<note a/>", "plain words", " leading space", "\nnewline", "é<x>", ""]),
        min_size=0,
        max_size=8,
    ),
    cut=st.integers(min_value=0, max_value=8),
    with_system=st.booleans(),
)
def test_a_prefix_extended_by_many_entries_at_once_is_extended_one_by_one(
    texts: list[str], cut: int, with_system: bool
) -> None:
    """A promotion's entries extend the kept layer at once (``_extend_many``): the same
    segments, exact count, hash and system text as extending by each in turn, whether the
    blocks start a new pre-tokenizer piece or not (then the join is counted whole); and
    as rendering the library afresh (an entry without text, kept unsent, has no block:
    no separator in the hash, no library heading before the first entry with text)."""
    from lamina.pipeline import Form, LibraryEntry, View
    from lamina.pipeline._model import library as library_module
    from lamina.pipeline._model.library import LibraryPrefix

    counter = TokenCounter()

    def entry(i: int, text: str) -> LibraryEntry:
        view = View(f"note:n{i}.md", "note", Form.FULL, f"n{i}", f"n{i}.md", True, f"h{i}")
        return LibraryEntry(view, text, counter.count(text), 1)

    entries = [entry(i, t) for i, t in enumerate(texts)]
    head = ("You are terse.",)
    before, after = Library(tuple(entries[:cut])), Library(tuple(entries))

    def grown(one_by_one: bool) -> tuple[object, ...]:
        prefix = LibraryPrefix()
        prefix.layer(before, counter)
        if with_system:
            prefix.system_text(before, counter, head)
        if one_by_one:
            done = prefix._rendered
            assert done is not None
            for e in after.entries[len(before) :]:
                done = library_module._extend_many(done, (e,), counter)
            prefix._entries, prefix._rendered = after.entries, done
        layer = prefix.layer(after, counter)
        return layer.segments, layer.tokens, layer.hash, prefix.system_text(after, counter, head)

    assert grown(False) == grown(True)
    fresh = Library(after.entries).layer(TokenCounter())
    system = LibraryPrefix().system_text(after, TokenCounter(), head)
    assert grown(False) == (fresh.segments, fresh.tokens, fresh.hash, system)
