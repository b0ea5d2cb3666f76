"""Index blocks: what the budget lists, one line an item, instead of sending a block.

A folder or tag group of this turn's items that does not fit is collapsed into one index
(``index:<group>``), from its last items back, as far as the excess needs; a preview
that would hold nothing but its omitted-sections line is never sent as a block: it joins
its group's index (an embedded section joins its note's line), or, outside any group,
goes as a not-sent reference. Each line names the item's key, title and size in full, so
the model can ask for it. The index itself is never previewed or summarized; only as a
last resort are its last lines left out, and then it says how many.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal

import attrs

from lamina.pipeline._model.artifacts import Artifact, make_artifact
from lamina.pipeline._model.envelope import NOT_SENT, Decision, DecisionAction, Form
from lamina.pipeline._turn.draft import Draft
from lamina.pipeline._turn.graph import Placement, TurnGraph
from lamina.pipeline._views.views import full_view

if TYPE_CHECKING:
    from lamina.pipeline._budget.fit import Budget

__all__ = [
    "INDEX_SOURCE",
    "IndexLine",
    "ItemIndex",
    "index_artifact",
    "is_index",
    "is_omitted_only",
    "plan_index",
    "settle_empty",
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

    @property
    def title(self) -> str:
        return f"index of {self.group}"

    @property
    def locator(self) -> str:
        return self.group

    @property
    def items(self) -> int:
        listed = len(self.lines) + sum(len(line.embeds) for line in self.lines)
        return self.kept_items + listed + self.unlisted

    def body(self) -> str:
        if not (self.lines or self.kept):
            return (
                f"{self.items} items of {self.group} {_HEADS[self.where]}; they are not listed "
                "here. Ask for one by its key, or for the folder again, to have it sent."
            )
        head = (
            f"{self.items} items of {self.group} {_HEADS[self.where]}; each line gives key, "
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
) -> Artifact:
    """The index artifact of ``group`` (key ``index:<group>``) listing ``lines`` (after
    ``kept``, an earlier index's lines that list ``kept_items`` items)."""
    payload = ItemIndex(group, tuple(lines), unlisted, where, tuple(kept), kept_items)
    return make_artifact(INDEX_SOURCE, f"{INDEX_SOURCE}:{group}", payload, recoverable=True)


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
    turn: TurnGraph, group: str, members: Sequence[_Member], gone: set[str], unlisted: int = 0
) -> TurnGraph:
    """``turn`` with ``gone`` taken out of its items and listed in ``group``'s index (made,
    or rewritten in its place; else placed where the first of them was)."""
    listed = _listed(turn, group) | gone
    artifact = index_artifact(group, _lines(turn, members, listed), unlisted)
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


def _indexed(group: str, count: int, why: str) -> Decision:
    reason = f"{count} item{'s' if count != 1 else ''} of {group} listed in its index ({why})"
    return Decision(
        "budget", group, "items", "index", reason, layer="L3", action=DecisionAction.INDEXED
    )


def _empty(env: Draft) -> list[str]:
    """This turn's previews whose block holds only its omitted-sections line (between
    its tag lines), as measured."""
    segments = (block.segment for block in env.items)
    return [
        s.key
        for s in segments
        if s.form is Form.PREVIEW
        and s.text.count("\n") == 2
        and is_omitted_only(s.text.split("\n")[1])
    ]


def _unsent(turn: TurnGraph, keys: Iterable[str]) -> tuple[TurnGraph, list[Decision]]:
    """``keys`` as not-sent references (outside any group: no index to join)."""
    wanted = set(keys)
    items = list(turn.items)
    decisions: list[Decision] = []
    for i, item in enumerate(items):
        if item.key not in wanted:
            continue
        marks = (*item.marks, (NOT_SENT, "true"))
        items[i] = attrs.evolve(item, form=Form.REFERENCE, marks=marks, limit=0)
        reason = "L3 preview would hold no section: not sent (a not-sent reference says so)"
        decisions.append(
            Decision(
                "budget", item.key, "preview", "reference", reason, layer="L3",
                action=DecisionAction.NOT_SENT,
            )
        )  # fmt: skip
    return attrs.evolve(turn, items=tuple(items)), decisions


def settle_empty(turn: TurnGraph, env: Draft) -> tuple[TurnGraph, list[Decision]] | None:
    """Every preview that would hold only its omitted-sections line, out of the blocks:
    into its group's index (an embed joins its note's line), else a not-sent reference.
    None when there is none. Each saves tokens: a line or a bare reference is smaller
    than the block it replaces."""
    empty = _empty(env)
    if not empty:
        return None
    groups = _groups(turn)
    where = {m.key: group for group, members in groups.items() for m in members}
    decisions: list[Decision] = []
    by_group: dict[str, set[str]] = {}
    for key in empty:
        group = where.get(key)
        if group is not None:
            by_group.setdefault(group, set()).add(key)
    for group, gone in by_group.items():
        turn = _with_index(turn, group, groups[group], gone)
        decisions.append(_indexed(group, len(gone), "their previews held no section"))
    loose = [key for key in empty if key not in where]
    if loose:
        turn, unsent = _unsent(turn, loose)
        decisions.extend(unsent)
    return turn, decisions


def plan_index(
    turn: TurnGraph, env: Draft, over: int, budget: Budget
) -> tuple[TurnGraph, list[Decision]] | None:
    """The budget's index cut: previews that hold nothing go first (``settle_empty``);
    else the largest group still sending items lists its last ones in its index until
    the excess is covered (the first ones keep their blocks); else the largest index
    leaves out its last lines (it says how many)."""
    settled = settle_empty(turn, env)
    if settled is not None:
        return settled
    sizes = {s.key: s.tokens for s in env.l3.segments}
    present = {item.key for item in turn.items}
    groups = _groups(turn)
    best: tuple[int, str, list[_Member]] | None = None
    for group, members in groups.items():
        sent = [m for m in members if m.key in present]
        size = sum(sizes.get(m.key, 0) for m in sent)
        if sent and (best is None or size > best[0]):
            best = (size, group, sent)
    if best is not None:
        _, group, sent = best
        gone = _tail(turn, group, sent, sizes, over)
        out = _with_index(turn, group, groups[group], gone)
        return out, [_indexed(group, len(gone), "no form of each fits")]
    return _unlist(turn, env, over, groups)


def _tail(
    turn: TurnGraph, group: str, sent: list[_Member], sizes: dict[str, int], over: int
) -> set[str]:
    """The last of ``sent`` (a group's items still sent) whose listing saves ``over``: each
    saves its block less its line; a new index costs its head too. An embed goes with
    its note, so a note's line is never split from its embeds."""
    ctx = turn.ctx
    counter = ctx.counter
    head = ctx.renderer.render(full_view(index_artifact(group, ())))
    saved = 0 if _listed(turn, group) else -counter.count(head) - 2
    gone: set[str] = set()
    for m in reversed(sent):
        gone.add(m.key)
        line = IndexLine(m.key, turn.artifact(m.key).title, _full_tokens(turn, m.key))
        saved += sizes.get(m.key, 0) - counter.count(line.render()) - 1
        if saved >= over and m.host is None:
            break
    return gone


def _unlist(
    turn: TurnGraph, env: Draft, over: int, groups: dict[str, list[_Member]]
) -> tuple[TurnGraph, list[Decision]] | None:
    """The largest index leaves out its last lines, enough to cover ``over`` (estimated
    from its lines' average size), at least one; None when no index has a line left."""
    sizes = {s.key: s.tokens for s in env.l3.segments}
    best: tuple[int, str, ItemIndex] | None = None
    for item in turn.items:
        artifact = turn.artifact(item.key)
        if is_index(artifact) and isinstance(artifact.payload, ItemIndex):
            payload = artifact.payload
            if payload.lines and (best is None or sizes.get(item.key, 0) > best[0]):
                best = (sizes.get(item.key, 0), item.key, payload)
    if best is None:
        return None
    size, key, payload = best
    per_line = max(1, size // (len(payload.lines) + 2))
    drop = min(len(payload.lines), max(1, -(-over // per_line)))
    kept = payload.lines[: len(payload.lines) - drop]
    dropped = sum(1 + len(line.embeds) for line in payload.lines[len(kept) :])
    new = index_artifact(payload.group, kept, payload.unlisted + dropped, payload.where)
    out = turn.with_artifact(new)
    reason = f"index of {payload.group} lists {dropped} items fewer (its lines do not all fit)"
    decision = Decision(
        "budget", key, "index", "index", reason, layer="L3", action=DecisionAction.INDEXED
    )
    return out, [decision]
