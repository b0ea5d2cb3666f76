"""Index blocks: one line an item (key, title, size in full) instead of its block.

A folder or tag group of this turn's items, or of the library's cut entries, may go as
one index (``index:<group>``): the objective (``objective``) chooses that form for the
members it lists, like any other form of theirs. A preview that would hold nothing but
its omitted-sections line (``is_omitted_only``) is never sent as a block. Each line lets
the model ask for the item; the index itself is never previewed or summarized.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

import attrs

from lamina.pipeline._model.artifacts import Artifact, make_artifact
from lamina.pipeline._turn.graph import Placement, TurnGraph
from lamina.pipeline._views.views import full_view

__all__ = [
    "INDEX_SOURCE",
    "IndexLine",
    "ItemIndex",
    "index_artifact",
    "is_index",
    "is_omitted_only",
]

INDEX_SOURCE = "index"
_OMITTED = re.compile(r"\[\.\.\. \d+ more sections? omitted \.\.\.\]")
Where = Literal["attached", "library"]


def is_index(artifact: Artifact) -> bool:
    """Whether ``artifact`` is an index block (never previewed, summarized or promoted)."""
    return artifact.source_type == INDEX_SOURCE


def is_omitted_only(body: str) -> bool:
    """Whether a preview's ``body`` holds nothing but its omitted-sections line."""
    return _OMITTED.fullmatch(body.strip()) is not None


@attrs.frozen
class IndexLine:
    """One item of an index: key, title, its size in full (tokens of its full block; 0 if
    not known), and what it embeds that is listed with it (key and size in full)."""

    key: str
    title: str
    tokens: int = 0
    embeds: tuple[tuple[str, int], ...] = ()

    def render(self) -> str:
        """``- key | title | N tokens``; the title is left out when the key already says it
        (a file's name without its extension), the size when it is not known."""
        name = self.key.rsplit("/", 1)[-1].split("#", 1)[0].rsplit(".", 1)[0]
        title = "" if self.title in (name, "") else f" | {self.title}"
        size = f" | {self.tokens} tokens" if self.tokens else ""
        text = f"- {self.key}{title}{size}"
        if self.embeds:
            text += " | embeds " + ", ".join(f"{k} ({n} tokens)" for k, n in self.embeds)
        return text


_HEADS: dict[str, str] = {
    "attached": "were attached but not sent for lack of room",
    "library": "were in the library and were set aside for room",
}


@attrs.frozen
class ItemIndex:
    """The payload of an index block: a group's listed items, and how many more it has
    that are not listed (``unlisted``: none unless the lines themselves did not fit)."""

    group: str
    lines: tuple[IndexLine, ...]
    unlisted: int = 0
    where: Where = "attached"
    kept: tuple[str, ...] = ()
    """Lines of an earlier index of the group, as they were written, before ``lines``."""
    kept_items: int = 0
    """How many items ``kept`` lists."""
    earlier: int = 0
    """Items attached again and counted, not listed: their text is already in the
    conversation (counted apart from ``unlisted``, which were not sent for lack of room)."""

    @property
    def title(self) -> str:
        return f"index of {self.group}"

    @property
    def locator(self) -> str:
        return self.group

    @property
    def items(self) -> int:
        listed = len(self.lines) + sum(len(line.embeds) for line in self.lines)
        return self.kept_items + listed + self.unlisted + self.earlier

    def _said(self) -> str:
        """What happened to the items: why they are not sent."""
        if not self.earlier:
            return _HEADS[self.where]
        rest = self.items - self.earlier
        why = f"{self.earlier} already in this conversation" + (
            f", {rest} for lack of room" if rest else ""
        )
        return f"were attached but not sent here ({why})"

    def body(self) -> str:
        if not (self.lines or self.kept):
            return (
                f"{self.items} items of {self.group} {self._said()}; they are not listed "
                "here. Ask for one by its key, or for the folder again, to have it sent."
            )
        head = (
            f"{self.items} items of {self.group} {self._said()}; each line gives key, "
            "title and size in full. Ask for one by its key to have it sent."
        )
        tail = (f"[... {self.unlisted} more items of {self.group} not listed ...]",)
        lines = (line.render() for line in self.lines)
        return "\n".join((head, *self.kept, *lines, *tail[: self.unlisted]))

    def attributes(self) -> tuple[tuple[str, str], ...]:
        return (("items", str(self.items)),)

    def replace_text(self, fn: Callable[[str], str]) -> ItemIndex:
        lines = tuple(attrs.evolve(line, title=fn(line.title)) for line in self.lines)
        return attrs.evolve(self, lines=lines, kept=tuple(fn(line) for line in self.kept))


def index_artifact(
    group: str,
    lines: Sequence[IndexLine],
    unlisted: int = 0,
    where: Where = "attached",
    kept: Sequence[str] = (),
    kept_items: int = 0,
    key: str = "",
    earlier: int = 0,
) -> Artifact:
    """The index artifact of ``group`` (key ``index:<group>`` unless ``key`` is given)
    listing ``lines`` (after ``kept``, an earlier index's lines that list ``kept_items``
    items), counting ``unlisted`` items not sent and ``earlier`` ones already sent."""
    payload = ItemIndex(group, tuple(lines), unlisted, where, tuple(kept), kept_items, earlier)
    return make_artifact(INDEX_SOURCE, key or f"{INDEX_SOURCE}:{group}", payload, recoverable=True)


# -- this turn's items -------------------------------------------------------------------


@attrs.frozen
class _Member:
    """An item of a group in the order Expand placed it, and the note that embeds it."""

    key: str
    host: str | None


def _groups(turn: TurnGraph) -> dict[str, list[_Member]]:
    """Each group root of the turn and its items (members, each followed by what it embeds
    inline, depth first), as Expand placed them; an item belongs to its first group."""
    out: dict[str, list[_Member]] = {}
    taken: set[str] = set()
    for root in turn.roots:
        if turn.kind(root) != "group":
            continue
        members: list[_Member] = []
        for key in turn.successors(root, "contains"):
            if key in taken or key.startswith(f"{INDEX_SOURCE}:"):
                continue
            taken.add(key)
            members.append(_Member(key, None))
            stack = [(key, t) for t in reversed(turn.inlined(key))]
            while stack:
                host, target = stack.pop()
                if target in taken:
                    continue
                taken.add(target)
                members.append(_Member(target, host))
                stack.extend((target, t) for t in reversed(turn.inlined(target)))
        out[root] = members
    return out


def _full_tokens(turn: TurnGraph, key: str) -> int:
    """Tokens of ``key``'s full block (counted when the turn was first measured)."""
    ctx = turn.ctx
    return ctx.counter.count(ctx.renderer.render(full_view(turn.artifact(key))))


def _lines(turn: TurnGraph, members: Sequence[_Member], listed: set[str]) -> list[IndexLine]:
    """The lines of the ``listed`` members in their order; an embedded item joins its
    host's line when the host is listed too."""
    lines: dict[str, IndexLine] = {}
    owner: dict[str, str] = {}
    for m in members:
        if m.key not in listed:
            continue
        size = _full_tokens(turn, m.key)
        host = owner.get(m.host) if m.host is not None else None
        if host is not None:
            line = lines[host]
            lines[host] = attrs.evolve(line, embeds=(*line.embeds, (m.key, size)))
            owner[m.key] = host
            continue
        lines[m.key] = IndexLine(m.key, turn.artifact(m.key).title, size)
        owner[m.key] = m.key
    return list(lines.values())


def _listed(turn: TurnGraph, group: str) -> set[str]:
    """The keys the turn's index of ``group`` lists now (none if it has no index)."""
    key = f"{INDEX_SOURCE}:{group}"
    if key not in turn.graph or turn.graph.nodes[key].get("artifact") is None:
        return set()
    payload = turn.artifact(key).payload
    assert isinstance(payload, ItemIndex)
    return {k for line in payload.lines for k in (line.key, *(e for e, _ in line.embeds))}


def _with_index(
    turn: TurnGraph,
    group: str,
    members: Sequence[_Member],
    gone: set[str],
    unlisted: int = 0,
    earlier: int = 0,
) -> TurnGraph:
    """``turn`` with ``gone`` taken out of its items and listed in ``group``'s index (made,
    or rewritten in its place; else placed where the first of them was), counting
    ``unlisted`` and ``earlier`` (``ItemIndex``)."""
    listed = _listed(turn, group) | gone
    artifact = index_artifact(group, _lines(turn, members, listed), unlisted, earlier=earlier)
    graph = turn.graph.copy()
    if artifact.key not in graph:
        graph.add_node(artifact.key, kind="artifact", artifact=artifact)
        graph.add_edge(group, artifact.key, kind="contains")
    else:
        graph.nodes[artifact.key]["artifact"] = artifact
    placed = any(item.key == artifact.key for item in turn.items)
    items: list[Placement] = []
    for item in turn.items:
        if item.key in gone:
            if not placed:
                items.append(Placement(artifact.key))
                placed = True
            continue
        items.append(item)
    return attrs.evolve(turn, graph=graph, items=tuple(items))
