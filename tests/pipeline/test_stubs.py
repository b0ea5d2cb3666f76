"""Library stubs folding into index blocks (``lamina.pipeline._budget.stubs``)."""

from __future__ import annotations

import attrs
import networkx as nx

from lamina.pipeline._budget.stubs import SET_ASIDE, fold
from lamina.pipeline._model.envelope import LIBRARY_HEADING, join_blocks
from lamina.pipeline._model.library import Library, LibraryEntry, LibraryPrefix
from lamina.pipeline._turn.graph import TurnContext, TurnGraph
from lamina.pipeline.sources import make_artifact
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.views import full_view, reference_view
from lamina.processors import NotePayload
from lamina.renderers import XmlRenderer


def _turn(number: int) -> TurnGraph:
    ctx = TurnContext(number, TokenCounter(), XmlRenderer())
    return TurnGraph(graph=nx.DiGraph(), ctx=ctx)


def _entry(turn: TurnGraph, path: str, *, stub: bool = False) -> LibraryEntry:
    payload = NotePayload(path, path, (), (), f"# {path}\n\nSome text of {path}.\n", ())
    artifact = make_artifact("note", f"note:{path}", payload, recoverable=True)
    view = reference_view(artifact) if stub else full_view(artifact)
    text = turn.ctx.renderer.render(view)
    return LibraryEntry(view, text, turn.ctx.counter.count(text), 1, 40)


def test_a_fold_changes_nothing_before_the_first_entry_it_takes() -> None:
    """The folder's index stands before the entry a later turn folds: that index is not
    extended (the prefix would break at it), a new one of the group takes the entry's
    place; an index after the first entry folded is extended in place."""
    turn = _turn(1)
    a, b, c, d = (_entry(turn, f"docs/{x}.md") for x in "abcd")
    library, _first, _ = fold(
        turn, Library((a, b, c, d)), "folder:docs", [_entry(turn, "docs/a.md", stub=True)]
    )
    assert library.keys() == (
        "index:folder:docs",
        "note:docs/b.md",
        "note:docs/c.md",
        "note:docs/d.md",
    )
    later = _turn(4)
    folded, made, grew = fold(
        later, library, "folder:docs", [_entry(later, "docs/c.md", stub=True)]
    )
    assert folded.keys() == (
        "index:folder:docs",
        "note:docs/b.md",
        "index:folder:docs@4",
        "note:docs/d.md",
    )
    assert folded.entries[:2] == library.entries[:2] and grew == made.tokens
    assert "note:docs/c.md" in made.text and "note:docs/a.md" not in made.text
    # b stands before the turn-4 index: folding it extends that one, not the first.
    again, extended, _ = fold(later, folded, "folder:docs", [_entry(later, "docs/b.md", stub=True)])
    assert again.keys() == ("index:folder:docs", "index:folder:docs@4", "note:docs/d.md")
    assert extended.key == "index:folder:docs@4" and "note:docs/b.md" in extended.text
    assert again.entries[0] == folded.entries[0]


def test_entries_set_aside_are_kept_in_one_index_that_is_not_sent() -> None:
    """Entries set aside go to the library's one index of them, wherever it stands: it
    holds them (a turn with room gives them back) but has no text, so the system message
    neither shows a count that names nothing nor changes where it stands when it counts
    one more."""
    turn = _turn(1)
    a, b, c = (_entry(turn, f"docs/{x}.md") for x in "abc")
    library, aside, grew = fold(turn, Library((a, b, c)), SET_ASIDE, [], [a])
    assert library.keys() == ("index:earlier turns", "note:docs/b.md", "note:docs/c.md")
    assert (aside.text, aside.tokens, grew) == ("", 0, 0)
    assert [e.key for e in aside.folded] == ["note:docs/a.md"]
    later = _turn(5)
    again, more, _ = fold(later, library, SET_ASIDE, [], [c])
    assert again.keys() == ("index:earlier turns", "note:docs/b.md")  # no @5 block
    assert [e.key for e in more.folded] == ["note:docs/a.md", "note:docs/c.md"]
    assert (more.text, dict(more.view.attributes)["items"]) == ("", "2")
    system, _ = LibraryPrefix().system_text(again, later.ctx.counter, ("You help.",))
    assert system == join_blocks(("You help.", LIBRARY_HEADING, b.text))
    alone, _ = LibraryPrefix().system_text(Library((more,)), later.ctx.counter, ("You help.",))
    assert alone == "You help."  # no heading over a library that sends nothing


def test_a_library_entrys_forms_are_remembered_with_its_turn() -> None:
    """The view memo is shared by every conversation of the process: an entry's forms
    (which carry the entry) are remembered by all they carry of it, so the same note
    taken in at another turn by another conversation gets forms of its own turn (a
    stale turn once weighed it by another's recency)."""
    from lamina.pipeline import Budget
    from lamina.pipeline._budget.objective import _library_forms
    from lamina.pipeline.views import ViewMemo

    memo = ViewMemo()
    for taken in (1, 6):
        ctx = TurnContext(8, TokenCounter(), XmlRenderer(), budget=Budget(4000), views=memo)
        turn = TurnGraph(graph=nx.DiGraph(), ctx=ctx)
        entry = attrs.evolve(_entry(turn, "docs/a.md"), turn=taken)
        forms = _library_forms(turn, entry, sent=False)
        assert {f.choice.entry.turn for f in forms if f.choice.entry is not None} == {taken}


def test_a_groups_index_head_is_counted_once_over_the_entries_it_would_take() -> None:
    """Each library entry after its group's last index carries a share of the head a new
    index of the group would cost, the shares summing to the head and its separator (they
    were each rounded up: 400 entries counted a head of about 20 tokens 400 times); an
    entry before the group's index carries none, a fold extends that index. Once a
    measured round gives the new index k lines, the head is split over k: any k entries
    in a row carry it once, one line alone carries it whole."""
    from lamina.pipeline._budget.objective import _SEP, _heads, _open_groups
    from lamina.pipeline._budget.stubs import _Renderer, stub_group

    turn = _turn(2)
    entries = [_entry(turn, f"docs/{i:03d}.md") for i in range(7)]
    group = stub_group(entries[0].whole_view)
    head = _Renderer(turn).head(group) + _SEP
    groups = _open_groups(attrs.evolve(turn, library=Library(tuple(entries))))
    assert groups == {group: (head, tuple(reversed([e.key for e in entries])))}
    heads = _heads(groups, {})
    assert sorted(heads) == sorted(e.key for e in entries)
    assert sum(heads.values()) == head and max(heads.values()) - min(heads.values()) <= 1
    assert set(_heads(groups, {group: 1}).values()) == {head}
    keys = groups[group][1]
    three = _heads(groups, {group: 3})
    assert all(sum(three[k] for k in keys[i : i + 3]) == head for i in range(len(keys) - 2))
    # An index of the group after the first three: only the entries after it carry shares.
    folded, _, _ = fold(
        turn, Library(tuple(entries)), group, [_entry(turn, "docs/003.md", stub=True)]
    )
    after = _heads(_open_groups(attrs.evolve(turn, library=folded)), {})
    assert set(after) == {"note:docs/004.md", "note:docs/005.md", "note:docs/006.md"}
    assert sum(after.values()) == head
