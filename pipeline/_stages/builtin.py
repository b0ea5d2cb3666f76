"""Stages and the pipeline that orders them; built-ins: expand, dedup, reference, promote."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import attrs
import networkx as nx

from lamina.pipeline._errors import LaminaError, PipelineError, StageError
from lamina.pipeline._model.artifacts import Artifact
from lamina.pipeline._model.envelope import Decision, DecisionAction, Form, View
from lamina.pipeline._model.library import Library, LibraryEntry
from lamina.pipeline._model.tools import chunk_source, is_turn_scoped
from lamina.pipeline._turn.assemble import fitted_preview
from lamina.pipeline._turn.graph import Placement, TurnContext, TurnGraph
from lamina.pipeline._turn.promotion import Promotion
from lamina.pipeline._views.summarize import PreparesSummaries
from lamina.pipeline._views.views import body_preview, carry_forward, full_view, reference_view

__all__ = ["Dedup", "Expand", "Pipeline", "Promote", "Reference", "Stage", "library_entry"]


class Stage(Protocol):
    """A named, small step: ``TurnGraph -> TurnGraph``, ordered by ``after``/``before``."""

    @property
    def name(self) -> str: ...

    @property
    def after(self) -> tuple[str, ...]: ...

    def __call__(self, turn: TurnGraph) -> TurnGraph: ...


def library_entry(artifact: Artifact, ctx: TurnContext) -> LibraryEntry:
    """The L2 entry for ``artifact``: its carry-forward view, rendered and counted."""
    view, text = carry_forward(artifact, ctx.counter, ctx.policy, ctx.renderer, ctx.views)
    full = ctx.counter.count(ctx.renderer.render(full_view(artifact)))
    return LibraryEntry(view, text, ctx.counter.count(text), ctx.turn, full)


@attrs.frozen
class Expand:
    """Replace folder and tag groups by their notes, keeping attachment order; place what a
    note embeds inline right after it."""

    name: str = "expand"
    after: tuple[str, ...] = ()

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        keys: list[str] = []
        embedded = 0
        for root in turn.roots:
            members = turn.successors(root, "contains") if turn.kind(root) == "group" else [root]
            for key in members:
                keys.append(key)
                inlined = _inlined(turn, key, {key})
                keys.extend(inlined)
                embedded += len(inlined)
        items = tuple(Placement(k) for k in keys)
        out = attrs.evolve(turn, items=items).with_stat("attached", len(items))
        return out.with_stat("embedded", embedded) if embedded else out


def _inlined(turn: TurnGraph, key: str, seen: set[str]) -> list[str]:
    """What ``key`` embeds inline, depth first, each key once along the way (cycle-safe)."""
    found: list[str] = []
    for target in turn.inlined(key):
        if target not in seen:
            seen.add(target)
            found.append(target)
            found.extend(_inlined(turn, target, seen))
    return found


@attrs.frozen
class Dedup:
    """Keep the first occurrence of each artifact key within a turn."""

    name: str = "dedup"
    after: tuple[str, ...] = ("expand",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        seen: set[str] = set()
        kept: list[Placement] = []
        decisions: list[Decision] = []
        for item in turn.items:
            if item.key not in seen:
                seen.add(item.key)
                kept.append(item)
            elif is_turn_scoped(artifact := turn.artifact(item.key)):
                # The same chunk (or call) from two tools: sent once; the saving is reported.
                text = turn.ctx.renderer.render(full_view(artifact))
                saved = turn.ctx.counter.count(text)
                decisions.append(
                    Decision(
                        self.name,
                        item.key,
                        "full",
                        "dropped",
                        "duplicate hit sent once",
                        saved,
                        action=DecisionAction.DROPPED,
                    )
                )
        removed = len(turn.items) - len(kept)
        out = attrs.evolve(turn, items=tuple(kept)).decide(*decisions)
        if decisions:
            out = out.with_stat(
                "retrieval_tokens_saved",
                dict(turn.stats).get("retrieval_tokens_saved", 0)
                + sum(d.tokens_saved for d in decisions),
            )
        return out.with_stat("duplicates_removed", removed)


@attrs.frozen
class Reference:
    """Turn L3 items that L2 already holds into references, following the policy."""

    name: str = "reference"
    after: tuple[str, ...] = ("dedup",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        policy = turn.ctx.policy
        library = turn.library
        items: list[Placement | None] = []
        decisions: list[Decision] = []
        chunks: list[tuple[int, Placement, str]] = []
        for item in turn.items:
            artifact = turn.artifact(item.key)
            source = chunk_source(item.key)
            if source is not None:
                # Placed once every other item's form is known (see ``_chunks``).
                chunks.append((len(items), item, source))
                items.append(None)
                continue
            entry = library.get(item.key)
            if entry is None:
                items.append(item)
                continue
            if entry.content_hash != artifact.content_hash:
                if policy.freshness == "pin":
                    items.append(attrs.evolve(item, form=Form.FULL, marks=(("newer", "true"),)))
                    decisions.append(
                        Decision(
                            self.name,
                            item.key,
                            "reference",
                            "full",
                            "content changed; L2 entry pinned",
                            action=DecisionAction.PINNED,
                        )
                    )
                    continue
                fresh = library_entry(artifact, turn.ctx)
                library = library.replace(fresh)
                decisions.append(
                    Decision(
                        self.name,
                        item.key,
                        str(entry.form),
                        str(fresh.form),
                        "content changed; L2 entry refreshed in place",
                        layer="L2",
                        action=DecisionAction.REFRESHED,
                    )
                )
                entry = fresh
            # A stub holds nothing to refer to: the item is sent again.
            if entry.form is Form.FULL or (
                policy.reattach == "reference" and entry.form is not Form.REFERENCE
            ):
                items.append(attrs.evolve(item, form=Form.REFERENCE))
                decisions.append(
                    Decision(
                        self.name,
                        item.key,
                        "full",
                        "reference",
                        f"in library as {entry.form}",
                        action=DecisionAction.REFERENCED,
                    )
                )
            else:
                items.append(
                    attrs.evolve(item, form=Form.FULL, marks=(("library", str(entry.form)),))
                )
                decisions.append(
                    Decision(
                        self.name,
                        item.key,
                        "reference",
                        "full",
                        f"library holds only a {entry.form}",
                        action=DecisionAction.RESENT,
                    )
                )
        decisions.extend(self._chunks(turn, library, items, chunks))
        placed = tuple(i for i in items if i is not None)
        refs = sum(1 for i in placed if i.form is Form.REFERENCE)
        out = attrs.evolve(turn, items=placed, library=library).decide(*decisions)
        saved = sum(d.tokens_saved for d in decisions if d.stage == self.name)
        if saved:
            out = out.with_stat(
                "retrieval_tokens_saved", dict(turn.stats).get("retrieval_tokens_saved", 0) + saved
            )
        return out.with_stat("references", refs)

    def _chunks(
        self,
        turn: TurnGraph,
        library: Library,
        items: list[Placement | None],
        chunks: list[tuple[int, Placement, str]],
    ) -> list[Decision]:
        """Fill the chunk slots of ``items``: a chunk whose source this turn sends in full
        (and whose text that source holds) is dropped, since the note is right beside it;
        one whose source L2 holds goes through ``_chunk``; any other is sent as it is."""
        full_here = {i.key for i in items if i is not None and i.form is Form.FULL}
        decisions: list[Decision] = []
        for index, item, source in chunks:
            artifact = turn.artifact(item.key)
            text = artifact.payload.body().strip()
            if source in full_here and text and text in turn.artifact(source).payload.body():
                ctx = turn.ctx
                saved = ctx.counter.count(ctx.renderer.render(full_view(artifact, item.marks)))
                decisions.append(
                    Decision(
                        self.name,
                        item.key,
                        "full",
                        "dropped",
                        f"chunk of {source}, sent in full in this turn",
                        saved,
                        action=DecisionAction.DROPPED,
                    )
                )
            elif source in library:
                items[index], decision = self._chunk(turn, library, item, source)
                decisions.append(decision)
            else:
                items[index] = item
        return decisions

    def _chunk(
        self, turn: TurnGraph, library: Library, item: Placement, source: str
    ) -> tuple[Placement, Decision]:
        """A retrieval chunk whose source L2 holds: a reference if L2 has its text in full,
        else sent, marked as overlapping the (shortened or older) L2 entry."""
        artifact = turn.artifact(item.key)
        entry = library.get(source)
        assert entry is not None
        text = artifact.payload.body().strip()
        if entry.form is Form.FULL and text and text in entry.view.body:
            ref_marks = (("entry", source),)
            ctx = turn.ctx
            full = ctx.counter.count(ctx.renderer.render(full_view(artifact, item.marks)))
            ref = ctx.counter.count(ctx.renderer.render(reference_view(artifact, ref_marks)))
            decision = Decision(
                self.name,
                item.key,
                "full",
                "reference",
                f"chunk of {source}, in library in full",
                max(0, full - ref),
                action=DecisionAction.REFERENCED,
            )
            return attrs.evolve(item, form=Form.REFERENCE, marks=ref_marks), decision
        marks = (*item.marks, ("overlaps", source), ("library", str(entry.form)))
        why = "its text differs" if entry.form is Form.FULL else f"it holds a {entry.form}"
        decision = Decision(
            self.name,
            item.key,
            "full",
            "full",
            f"chunk of {source} sent: the library entry {why}",
            action=DecisionAction.OVERLAPPING,
        )
        return attrs.evolve(item, marks=marks), decision


def _as_sent(turn: TurnGraph, item: Placement) -> tuple[View, str]:
    view = fitted_preview(turn, item)
    return view, turn.ctx.renderer.render(view)


@attrs.frozen
class Promote:
    """After the turn, L3 items new to the library enter L2 in carry-forward form: a
    ``Promotion`` the conversation makes off the request's critical path."""

    name: str = "promote"
    after: tuple[str, ...] = ("reference",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        # A new item the budget could only refer to was not sent; it is not promoted (its
        # not-sent reference says so). One the budget fitted to a preview enters L2 in the
        # form it was sent. Tool results, retrieval chunks and indexes never enter L2.
        new = tuple(
            item
            for item in turn.items
            if item.form is not Form.REFERENCE
            and item.key not in turn.library
            and not is_turn_scoped(turn.artifact(item.key))
            and turn.artifact(item.key).source_type != "index"  # lists what was not sent
        )
        # The promotion, made after the turn, keeps of the graph only the new artifacts.
        kept = turn.keeping(dict.fromkeys(item.key for item in new))
        promotion = Promotion(
            lambda: _promote(kept, new),
            lambda library: _prepare_summaries(kept, library, library.entries[len(kept.library) :]),
        )
        return attrs.evolve(turn, promoted=promotion).with_views()


def _promote(turn: TurnGraph, new: tuple[Placement, ...]) -> Library:
    """``turn``'s library with the ``new`` items appended in carry-forward form."""
    ctx = turn.ctx
    library = turn.library
    ctx.prefix.layer(library, ctx.counter)  # rendered once here; appends extend it
    unique = {item.key: item for item in new}
    forms = [_promoted(turn, item) for item in unique.values()]
    counts = ctx.counter.count_many([text for _, text, _ in forms])
    entries = []
    for (view, text, whole), tokens in zip(forms, counts, strict=True):
        # The full block was counted when L3 was first measured: a memo hit.
        full = ctx.counter.count(ctx.renderer.render(full_view(turn.artifact(view.key))))
        entries.append(LibraryEntry(view, text, tokens, ctx.turn, full, whole=whole))
    return library.extend(entries)


def _promoted(turn: TurnGraph, item: Placement) -> tuple[View, str, View | None]:
    """The view ``item`` enters L2 with, its text, and the whole view it stands for (None:
    it enters whole): the carry-forward view when the budget cut it, the full view when
    it is carried forward as a preview.

    A budget-fitted preview enters as sent (the counts are made; nothing is previewed
    again) unless it is larger than the carry-forward form can be (``verbatim_tokens``):
    then it enters in carry-forward form, as an item sent whole would, so one turn's
    material (a transcript given most of a turn's window) does not hold the library's
    room in every later turn. A preview entering as sent of an item carried forward whole
    keeps that as its whole, so a later turn with room gives it back like any entry the
    budget cut."""
    ctx = turn.ctx
    artifact = turn.artifact(item.key)
    if item.form is Form.PREVIEW and item.limit:
        view, text = _as_sent(turn, item)
        if ctx.counter.count(text) <= ctx.policy.verbatim_tokens:
            whole = full_view(artifact)  # counted when L3 was first measured: a memo hit
            carried = ctx.counter.count(ctx.renderer.render(whole)) <= ctx.policy.verbatim_tokens
            return view, text, whole if carried else None
    view, text = carry_forward(artifact, ctx.counter, ctx.policy, ctx.renderer, ctx.views)
    # A note carried forward as a preview keeps its whole form: a later turn with room
    # gives it back like any entry the budget cut.
    return view, text, full_view(artifact) if view.form is Form.PREVIEW else None


def _prepare_summaries(
    turn: TurnGraph, library: Library, new: Sequence[LibraryEntry]
) -> Iterator[None]:
    """Once the library fills half the budget, its next cuts preview entries kept whole and
    summarize previews: make the new ones' previews, rank them and count them (the
    summary's size) here, off the request's path, so the turn that cuts only selects.
    Yields before each entry's work (``Promotion`` stops there when the next turn comes)."""
    ctx = turn.ctx
    summarizer = ctx.summarizer
    if ctx.budget is None or not isinstance(summarizer, PreparesSummaries):
        return
    if 2 * sum(entry.tokens for entry in library) < ctx.budget.limit:
        return
    for view in (entry.view for entry in new):
        if not view.recoverable or view.form not in (Form.FULL, Form.PREVIEW):
            continue
        yield
        body = view.body
        if view.form is Form.FULL:  # the cut makes its preview first
            body = body_preview(body, ctx.counter, ctx.policy, ctx.views).text
        ctx.counter.count(body)
        summarizer.prepare(body)


class Pipeline:
    """Stages ordered by their declared dependencies, validated when built.

    A stage may declare ``after`` (names it runs after) and, optionally, ``before``
    (names it must run before). Among independent stages the given order is kept.
    """

    def __init__(self, stages: Iterable[Stage]) -> None:
        given = list(stages)
        names = [s.name for s in given]
        by_name: dict[str, Stage] = {}
        for stage in given:
            if stage.name in by_name:
                raise PipelineError(stage.name, "two stages have this name")
            by_name[stage.name] = stage
        graph = nx.DiGraph()
        graph.add_nodes_from(names)
        for stage in given:
            for dep in stage.after:
                if dep not in by_name:
                    raise PipelineError(stage.name, f"runs after unknown stage {dep!r}")
                graph.add_edge(dep, stage.name)
            for dep in getattr(stage, "before", ()):
                if dep not in by_name:
                    raise PipelineError(stage.name, f"runs before unknown stage {dep!r}")
                graph.add_edge(stage.name, dep)
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            cycle = []
        if cycle:
            path = " -> ".join([str(u) for u, _ in cycle] + [str(cycle[0][0])])
            raise PipelineError(str(cycle[0][0]), f"dependency cycle: {path}")
        position = {name: i for i, name in enumerate(names)}
        order = nx.lexicographical_topological_sort(graph, key=lambda n: position[n])
        self.stages: tuple[Stage, ...] = tuple(by_name[n] for n in order)

    @classmethod
    def default(cls) -> Pipeline:
        """The built-in stages, ordered once per process: a pipeline and its frozen stages
        never change (``with_stage``/``without`` make new ones), so conversations share it."""
        return _default_pipeline() if cls is Pipeline else cls(_default_pipeline().stages)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def with_stage(self, stage: Stage) -> Pipeline:
        """A new pipeline with ``stage`` added (validated again)."""
        return Pipeline([*self.stages, stage])

    def without(self, name: str) -> Pipeline:
        if name not in self.names:
            raise PipelineError(name, "no stage with this name")
        return Pipeline([s for s in self.stages if s.name != name])

    def run(self, turn: TurnGraph) -> TurnGraph:
        """Run every stage in order, timing each (``report.timings``)."""
        timings = list(turn.timings)
        for stage in self.stages:
            start = time.perf_counter()
            try:
                turn = stage(turn)
            except LaminaError:
                raise
            except Exception as exc:
                raise StageError(stage.name, f"{type(exc).__name__}: {exc}") from exc
            timings.append((stage.name, time.perf_counter() - start))
        return attrs.evolve(turn, timings=tuple(timings))


@functools.cache
def _default_pipeline() -> Pipeline:
    from lamina.pipeline._budget.objective import Solve
    from lamina.pipeline._recall.retrievers import Bm25Retriever
    from lamina.pipeline._stages.pages import MergePages

    stages: list[Stage] = [
        Expand(),
        Dedup(),
        MergePages(),
        Reference(),
        Solve(retriever=Bm25Retriever),
        Promote(),
    ]
    return Pipeline(stages)
