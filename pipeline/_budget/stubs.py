"""Library stubs and the index blocks they fold into.

An entry the budget cut to a stub (a reference that keeps key, title and locator) costs
about 40-60 tokens. The objective (``objective``) may instead fold a folder's (or, outside
the vault, a source type's) stubs into one index block in the place of its oldest stub,
one line an entry (key, title, size in full): ``fold`` makes that block and ``stub_group``
names the group. An entry the budget sets aside (``SET_ASIDE``) goes to the library's one
index that lists nothing: it is kept, not sent (``_Renderer.entry``). The result is a
function of the library alone, so a restored conversation makes the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from lamina.pipeline._budget.index import INDEX_SOURCE, IndexLine, index_artifact
from lamina.pipeline._model.envelope import View
from lamina.pipeline._model.library import Library, LibraryEntry
from lamina.pipeline._turn.graph import TurnGraph
from lamina.pipeline._views.views import full_view

__all__ = [
    "SET_ASIDE",
    "fold",
    "stub_group",
]

SET_ASIDE = "earlier turns"
"""The group of the library's entries set aside: one index that lists none of them, kept
but not sent (a count names nothing the model could ask for), whose entries a turn with
room gives back."""

_UNLISTED = re.compile(r"^\[\.\.\. (\d+) more items of .* not listed \.\.\.\]$")


def stub_group(view: View) -> str:
    """The group a library entry's stub collapses into: ``folder:<its note's folder>``
    (``folder:.`` at the vault's top), else ``source:<source type>``."""
    if view.source_type == "note":
        path = view.locator.split("#", 1)[0]
        return f"folder:{path.rsplit('/', 1)[0] if '/' in path else '.'}"
    return f"source:{view.source_type}"


@attrs.frozen
class _Renderer:
    """What makes an index entry: the turn's renderer and counter."""

    turn: TurnGraph

    def entry(
        self,
        group: str,
        lines: Sequence[IndexLine],
        kept: tuple[str, ...],
        kept_items: int,
        unlisted: int,
        turn: int,
        folded: tuple[LibraryEntry, ...],
        key: str = "",
    ) -> LibraryEntry:
        artifact = index_artifact(group, lines, unlisted, "library", kept, kept_items, key)
        view = full_view(artifact)
        if not (lines or kept):
            # A count only: kept for the entries it holds, not sent. Sent, its block would
            # take the text-free share for no title the model could ask for, and change
            # the prefix where it stands whenever it counts one more.
            return LibraryEntry(view, "", 0, turn, folded=folded)
        text = self.turn.ctx.renderer.render(view)
        return LibraryEntry(view, text, self.turn.ctx.counter.count(text), turn, folded=folded)

    def head(self, group: str) -> int:
        """The tokens of a new index block of ``group`` before its lines: its head."""
        view = full_view(index_artifact(group, (), 0, "library"))
        return self.turn.ctx.counter.count(self.turn.ctx.renderer.render(view))


def _listed(entry: LibraryEntry) -> tuple[tuple[str, ...], int, int]:
    """An index entry's lines as written, how many items they list, and its unlisted count."""
    lines = entry.view.body.split("\n")[1:]
    items = int(dict(entry.view.attributes).get("items", "0"))
    unlisted = 0 if lines else items
    if lines and (m := _UNLISTED.match(lines[-1])):
        unlisted = int(m.group(1))
        lines = lines[:-1]
    return tuple(lines), items - unlisted, unlisted


def fold(
    turn: TurnGraph,
    library: Library,
    group: str,
    stubs: Sequence[LibraryEntry],
    counted: Sequence[LibraryEntry] = (),
    *,
    join: bool = False,
) -> tuple[Library, LibraryEntry, int]:
    """``library`` with the entries of ``stubs``' keys (their stub forms, each keeping its
    whole, in library order, all of ``group``) listed in a library index of the group, and
    those of ``counted`` only counted there. A fold changes nothing placed before the
    first entry it takes (the cached prefix breaks there, not earlier): the group's first
    index after that entry is extended, else a new one takes that entry's place (keyed
    ``index:<group>``, or ``index:<group>@<turn>`` beside an earlier one). With ``join``
    the group's last index before that entry is extended instead where none stands after
    it: the prefix breaks at that index, but no new block's head is sent (the request's
    text-free share). An index that is not sent and that only counts join (the entries
    set aside, ``SET_ASIDE``) changes no byte: it is extended wherever it stands. The
    library, the index and the tokens the index grew by (all of it when new)."""
    moved = (*stubs, *counted)
    keys = library.keys()
    first = min((keys.index(e.key) for e in moved), default=0)
    # The group's index blocks, in library order: the first after that entry, else (with
    # ``join``) the last before it.
    blocks = [
        (i, e)
        for i, e in enumerate(library.entries)
        if e.view.source_type == INDEX_SOURCE and e.view.locator == group
    ]
    unsent = not stubs  # counts alone leave an index that is not sent unsent
    index = next((e for i, e in blocks if i > first or (unsent and not e.text)), None)
    if index is None and join:
        index = next((e for i, e in reversed(blocks) if i < first), None)
    key = index.key if index is not None else f"{INDEX_SOURCE}:{group}"
    if index is None and key in library:
        key = f"{key}@{turn.ctx.turn}"
    kept, items, unlisted = _listed(index) if index is not None else ((), 0, 0)
    lines = [IndexLine(e.key, e.view.title, e.full_tokens) for e in stubs]
    folded = (*(index.folded if index is not None else ()), *stubs, *counted)
    since = min(e.turn for e in (*moved, *(() if index is None else (index,))))
    new = _Renderer(turn).entry(
        group, lines, kept, items, unlisted + len(counted), since, folded, key
    )
    gone = {e.key for e in moved}
    entries: list[LibraryEntry] = []
    for i, entry in enumerate(library.entries):
        if entry.key == key or (entry.key in gone and index is None and i == first):
            entries.append(new)
        elif entry.key not in gone:
            entries.append(entry)
    grew = new.tokens - (index.tokens if index is not None else 0)
    return Library(tuple(entries)), new, grew
