"""Library stubs that stay small: past a share of the window, stubs collapse into indexes.

An entry the budget cut to a stub (a reference that keeps key, title and locator) costs
about 40-60 tokens; a conversation that attaches a folder a turn would pile them up until
they fill the window. ``bound_stubs`` keeps stubs and the library's indexes under
``Budget.stub_share`` of the window: the oldest folder's (or, outside the vault, source
type's) stubs first collapse into one index block in the place of its oldest stub, one
line an entry (key, title, size in full); if that is not enough, the oldest indexes keep
only their count of items. Every collapsed key is reported as a decision (L2), and the
result is a function of the library alone, so a restored conversation makes the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from lamina.pipeline._budget.index import INDEX_SOURCE, IndexLine, index_artifact
from lamina.pipeline._model.envelope import Decision, DecisionAction, Form, View
from lamina.pipeline._model.library import Library, LibraryEntry
from lamina.pipeline._turn.draft import Draft
from lamina.pipeline._turn.graph import TurnGraph
from lamina.pipeline._views.views import full_view

if TYPE_CHECKING:
    from lamina.pipeline._budget.fit import Budget

__all__ = [
    "bound_stubs",
    "fold",
    "plan_stubs",
    "refold",
    "settle_stubs",
    "stub_cap",
    "stub_group",
    "stub_tokens",
]

_UNLISTED = re.compile(r"^\[\.\.\. (\d+) more items of .* not listed \.\.\.\]$")


def stub_group(view: View) -> str:
    """The group a library entry's stub collapses into: ``folder:<its note's folder>``
    (``folder:.`` at the vault's top), else ``source:<source type>``."""
    if view.source_type == "note":
        path = view.locator.split("#", 1)[0]
        return f"folder:{path.rsplit('/', 1)[0] if '/' in path else '.'}"
    return f"source:{view.source_type}"


def _is_stub(entry: LibraryEntry) -> bool:
    return entry.form is Form.REFERENCE


def _is_index(entry: LibraryEntry) -> bool:
    return entry.view.source_type == INDEX_SOURCE


def stub_tokens(library: Library) -> int:
    """Tokens of the library's stubs and indexes (blocks; separators aside)."""
    return sum(e.tokens for e in library.entries if _is_stub(e) or _is_index(e))


def stub_cap(budget: Budget) -> int:
    """The most tokens stubs and library indexes may take: ``stub_share`` of the window."""
    return math.floor(budget.stub_share * budget.context_window)


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
    ) -> LibraryEntry:
        artifact = index_artifact(group, lines, unlisted, "library", kept, kept_items)
        view = full_view(artifact)
        ctx = self.turn.ctx
        text = ctx.renderer.render(view)
        return LibraryEntry(view, text, ctx.counter.count(text), turn, folded=folded)


def _listed(entry: LibraryEntry) -> tuple[tuple[str, ...], int, int]:
    """An index entry's lines as written, how many items they list, and its unlisted count."""
    lines = entry.view.body.split("\n")[1:]
    items = int(dict(entry.view.attributes).get("items", "0"))
    unlisted = 0 if lines else items
    if lines and (m := _UNLISTED.match(lines[-1])):
        unlisted = int(m.group(1))
        lines = lines[:-1]
    return tuple(lines), items - unlisted, unlisted


def bound_stubs(
    turn: TurnGraph, library: Library, cap: int
) -> tuple[Library, list[Decision]] | None:
    """``library`` with its stubs and indexes under ``cap`` tokens where collapsing can get
    them there: oldest group first, stubs into its index (lines; in the index's place, or
    a new one in the oldest stub's), down to three quarters
    of the cap (so the next turns' stubs do not rewrite the library again at once); then,
    oldest first, indexes down to their count until under the cap. None when they are
    under the cap or nothing saves."""
    total = stub_tokens(library)
    if total <= cap:
        return None
    make = _Renderer(turn)
    slots: list[LibraryEntry | None] = list(library.entries)
    members: dict[str, list[int]] = {}
    for i, entry in enumerate(library.entries):
        if _is_stub(entry) or _is_index(entry):
            group = entry.view.locator if _is_index(entry) else stub_group(entry.view)
            members.setdefault(group, []).append(i)
    order = sorted(members, key=lambda g: (min(library.entries[i].turn for i in members[g]),
                                           members[g][0]))  # fmt: skip
    decisions: list[Decision] = []
    for level, goal in ((1, cap * 3 // 4), (2, cap)):
        for group in order:
            if total <= goal:
                break
            at = [i for i in members[group] if slots[i] is not None]
            entries = [slots[i] for i in at]
            old = [e for e in entries if e is not None]
            index = next((e for e in old if _is_index(e)), None)
            stubs = [e for e in old if not _is_index(e)]
            kept, items, unlisted = _listed(index) if index is not None else ((), 0, 0)
            since = min(e.turn for e in old)
            # The collapsed stubs ride inside the index, so a turn with room unfolds them.
            folded = (*(index.folded if index is not None else ()), *stubs)
            if level == 1:
                if not stubs or (index is None and len(stubs) < 2):
                    continue
                lines = [IndexLine(e.key, e.view.title, e.full_tokens) for e in stubs]
                new = make.entry(group, lines, kept, items, unlisted, since, folded)
            else:
                if index is None or stubs or not kept:
                    continue
                new = make.entry(group, (), (), 0, items + unlisted, since, folded)
            saved = sum(e.tokens for e in old) - new.tokens
            if saved <= 0:
                continue
            total -= saved
            # An index stays where it is (the stubs before it join it there: moving it
            # would reorder the library); a new one takes the place of the oldest stub.
            place = at[0] if index is None else next(i for i in at if slots[i] is index)
            for i in at:
                slots[i] = new if i == place else None
            decisions.extend(_decisions(group, stubs, index, new, level))
    if not decisions:
        return None
    return Library(tuple(e for e in slots if e is not None)), decisions


def fold(
    turn: TurnGraph,
    library: Library,
    group: str,
    stubs: Sequence[LibraryEntry],
    counted: Sequence[LibraryEntry] = (),
) -> tuple[Library, LibraryEntry, int]:
    """``library`` with the entries of ``stubs``' keys (their stub forms, each keeping its
    whole, in library order, all of ``group``) listed in the group's library index, and
    those of ``counted`` only counted there: the index there is extended, else a new one
    takes the place of the first. The library, the index and the tokens the index grew
    by (all of it when new)."""
    key = f"{INDEX_SOURCE}:{group}"
    index = library.get(key)
    kept, items, unlisted = _listed(index) if index is not None else ((), 0, 0)
    lines = [IndexLine(e.key, e.view.title, e.full_tokens) for e in stubs]
    folded = (*(index.folded if index is not None else ()), *stubs, *counted)
    moved = (*stubs, *counted)
    since = min(e.turn for e in (*moved, *(() if index is None else (index,))))
    new = _Renderer(turn).entry(
        group, lines, kept, items, unlisted + len(counted), since, folded
    )
    gone = {e.key for e in moved}
    first = min((library.keys().index(e.key) for e in moved), default=0)
    entries: list[LibraryEntry] = []
    for i, entry in enumerate(library.entries):
        if entry.key == key or (entry.key in gone and index is None and i == first):
            entries.append(new)
        elif entry.key not in gone:
            entries.append(entry)
    grew = new.tokens - (index.tokens if index is not None else 0)
    return Library(tuple(entries)), new, grew


def refold(turn: TurnGraph, index: LibraryEntry, folded: Sequence[LibraryEntry]) -> LibraryEntry:
    """Library ``index`` listing only ``folded`` (the entries it still folds, after some
    came back): one line an entry, or only their count where the index kept only its
    count. The same key and group, so it stays in the index's place."""
    lines, _, _ = _listed(index)
    group = index.view.locator
    since = min((e.turn for e in folded), default=index.turn)
    make = _Renderer(turn)
    if not lines:
        return make.entry(group, (), (), 0, len(folded), since, tuple(folded))
    listed = [IndexLine(e.key, e.view.title, e.full_tokens) for e in folded]
    return make.entry(group, listed, (), 0, 0, since, tuple(folded))


def _decisions(
    group: str,
    stubs: list[LibraryEntry],
    index: LibraryEntry | None,
    new: LibraryEntry,
    level: int,
) -> list[Decision]:
    if level == 2:
        reason = f"library index of {group} keeps only its count (stubs over their share)"
        return [
            Decision(
                "budget", new.key, "index", "index", reason, layer="L2",
                action=DecisionAction.INDEXED,
            )
        ]  # fmt: skip
    reason = f"stub listed in the library's index of {group} (stubs over their share)"
    return [
        Decision(
            "budget", e.key, "reference", "index", reason, layer="L2",
            action=DecisionAction.INDEXED,
        )
        for e in stubs
    ]  # fmt: skip


def settle_stubs(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, list[Decision]] | None:
    """``turn`` with its library's stubs under their share (``bound_stubs``), or None."""
    budget = turn.ctx.budget
    if budget is None:
        return None
    bounded = bound_stubs(turn, turn.library, stub_cap(budget))
    if bounded is None:
        return None
    library, decisions = bounded
    return attrs.evolve(turn, library=library), decisions


def plan_stubs(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """The budget's first plan: stubs over their share collapse before anything else is
    cut (``settle_stubs``); None while they are under it."""
    return settle_stubs(turn, env)
