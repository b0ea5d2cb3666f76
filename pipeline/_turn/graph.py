"""The per-turn artifact graph: artifacts, groups, links and derived views (networkx)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import networkx as nx

from lamina.pipeline._errors import ArgumentError
from lamina.pipeline._model.artifacts import Artifact, Processed, TurnWarning
from lamina.pipeline._model.envelope import BudgetReport, Decision, Form
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._model.library import Library, LibraryPrefix
from lamina.pipeline._tokens.counter import TokenCounter
from lamina.pipeline._turn.history import HistorySegments
from lamina.pipeline._views.summarize import Summarizer, SummaryCache, TextRankSummarizer
from lamina.pipeline._views.views import Policy, SegmentRenderer, ViewMemo

if TYPE_CHECKING:
    from lamina.pipeline._recall.memory import RecallMemo
    from lamina.pipeline._turn.budget import Budget
    from lamina.pipeline._turn.draft import Draft
    from lamina.pipeline._turn.promotion import Promotion

__all__ = ["HistoryView", "Placement", "SystemPrompt", "TurnContext", "TurnGraph"]


@attrs.frozen
class Placement:
    """Where an artifact goes this turn: its key in L3, its form, and for excerpts a size."""

    key: str
    form: Form = Form.FULL
    marks: tuple[tuple[str, str], ...] = ()
    limit: int = 0


@attrs.frozen
class SystemPrompt:
    """L1: a stable contract and an optional mutable part (memory, project overlays)."""

    stable: str = ""
    mutable: str = ""


@attrs.frozen
class HistoryView:
    """What L4 shows: turns from ``start`` on, with the listed replies shortened.

    Kept between turns so the history cut point moves in steps (hysteresis) and a reply,
    once shortened, stays shortened: both keep the cached prefix stable.
    """

    start: int = 1
    shortened: tuple[int, ...] = ()


@attrs.frozen
class TurnContext:
    """What stages may read besides the graph: turn number, counter, renderer, policy."""

    turn: int
    counter: TokenCounter = attrs.field(eq=False)
    renderer: SegmentRenderer = attrs.field(eq=False)
    policy: Policy = attrs.field(factory=Policy)
    budget: Budget | None = None
    summaries: SummaryCache = attrs.field(factory=SummaryCache, eq=False)
    summarizer: Summarizer = attrs.field(factory=TextRankSummarizer, eq=False)
    views: ViewMemo = attrs.field(factory=ViewMemo, eq=False)
    # The conversation's rendered library, extended turn to turn (mutable on purpose).
    prefix: LibraryPrefix = attrs.field(factory=LibraryPrefix, eq=False)
    # The conversation's L4 segments and hash, extended turn to turn (mutable on purpose).
    l4: HistorySegments = attrs.field(factory=HistorySegments, eq=False)
    # The conversation's recall index, extended turn to turn (mutable on purpose).
    recall: RecallMemo | None = attrs.field(default=None, eq=False)


@attrs.frozen
class TurnGraph:
    """One turn's state as it flows through the stages; stages return evolved copies.

    ``graph`` nodes are keys with a ``kind`` ("artifact", "group", "linked", "view") and,
    for artifacts, the ``artifact``; edges carry a ``kind`` ("contains", "links",
    "embeds", "view"). The graph is never mutated in place: ``with_artifact`` and
    ``with_views`` copy it.
    """

    graph: nx.DiGraph = attrs.field(eq=False, repr=False)
    ctx: TurnContext = attrs.field(eq=False)
    roots: tuple[str, ...] = ()
    items: tuple[Placement, ...] = ()
    library: Library = attrs.field(factory=Library)
    promoted: Promotion | None = None
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[TurnWarning, ...] = ()
    stats: tuple[tuple[str, int], ...] = ()
    system: SystemPrompt = attrs.field(factory=SystemPrompt)
    history: tuple[HistoryEntry, ...] = ()
    history_view: HistoryView = attrs.field(factory=HistoryView)
    query: str = ""
    budget_report: BudgetReport | None = None
    # The value the requests have forgone since the budget's last buy (``solver.solve``'s
    # ``regret``): the conversation's before the budget stage, the next turn's after it.
    regret: float = 0.0
    # How many library entries the request as sent holds in its system message (where the
    # batch settled, ``BatchState.settled``); the rest stay in the history messages that
    # sent them until a change to them or to history sends the library as built. None:
    # the library is sent as built.
    settled: int | None = None
    # The request as sent beside the build: the exact tokens of its first ``settled``
    # library entries joined (``BatchState.library_tokens``), and its user messages since
    # the batch settled as (turn, exact tokens): they hold the library's growth as they
    # sent it, with the indexes, references and restores beside it; () when the library
    # is sent as built. ``shed``: the same messages as the batch sends them when their
    # extension is over the limit (``batch.shed_counts``); () where it then settles.
    # ``sheds``: the growth's keys a change to which the batch sheds from (its blocks
    # from there sent as the library holds them); a change to another settles it
    # (``batch.shed_keys``). ``stale``: the growth's first entry whose block the batch
    # sent otherwise than the library now holds it ("": none; ``batch.stale_key``): a
    # shed re-sends from that block whichever entry it is for.
    settled_tokens: int = 0
    deferred: tuple[tuple[int, int], ...] = ()
    shed: tuple[tuple[int, int], ...] = ()
    sheds: tuple[str, ...] = ()
    stale: str = ""
    # The library as the model last saw it, before this turn's budget cuts: what the
    # preview of an edited note is compared with (its changed sections go first).
    seen: Library | None = attrs.field(default=None, eq=False, repr=False)
    timings: tuple[tuple[str, float], ...] = attrs.field(default=(), eq=False)
    # The draft the budget stage measured (it names what it was rendered from), so the
    # render step completes it when no later stage changed those inputs.
    measured: Draft | None = attrs.field(default=None, eq=False, repr=False)

    def render_inputs(self) -> tuple[object, ...]:
        """What the layers are rendered from; compared by identity, not value."""
        return (self.items, self.library, self.system, self.history, self.history_view, self.query)

    @classmethod
    def build(
        cls,
        processed: Sequence[Processed],
        ctx: TurnContext,
        library: Library,
        **rest: Any,
    ) -> TurnGraph:
        """The graph of what was attached, in attachment order."""
        graph = nx.DiGraph()
        roots: list[str] = []
        warnings: list[TurnWarning] = []
        for p in processed:
            warnings.extend(p.warnings)
            for artifact in (*p.artifacts, *p.embedded):
                existing = graph.nodes.get(artifact.key, {}).get("artifact")
                if existing is not None and existing.content_hash != artifact.content_hash:
                    warnings.append(
                        TurnWarning(
                            "attached-twice",
                            artifact.key,
                            "attached twice with different content; kept the first",
                        )
                    )
                    continue
                graph.add_node(artifact.key, kind="artifact", artifact=artifact)
            if p.group is not None:
                graph.add_node(p.group, kind="group", artifact=None)
                roots.append(p.group)
            else:
                roots.extend(a.key for a in p.artifacts)
            for link in p.links:
                for end in (link.source, link.target):
                    if end not in graph:
                        graph.add_node(end, kind="linked", artifact=None)
                graph.add_edge(link.source, link.target, kind=link.kind, inline=link.inline)
        return cls(graph, ctx, tuple(roots), library=library, warnings=tuple(warnings), **rest)

    def artifact(self, key: str) -> Artifact:
        artifact: Artifact | None = self.graph.nodes[key].get("artifact")
        if artifact is None:
            raise ArgumentError("key", f"{key} is not an artifact of this turn")
        return artifact

    def artifacts(self) -> Iterator[Artifact]:
        for _, data in self.graph.nodes(data=True):
            if data.get("artifact") is not None:
                yield data["artifact"]

    # Edges are read through ``succ``: networkx's ``edges`` view refers back to its graph,
    # a cycle that keeps a graph and its copy alive together until the collector runs.
    def successors(self, key: str, kind: str) -> list[str]:
        return [t for t, edge in self.graph.succ[key].items() if edge["kind"] == kind]

    def inlined(self, key: str) -> list[str]:
        """The artifacts ``key`` embeds inline, in the order its text embeds them."""
        return [
            t
            for t, edge in self.graph.succ[key].items()
            if edge["kind"] == "embeds"
            and edge.get("inline")
            and self.graph.nodes[t].get("artifact") is not None
        ]

    def kind(self, key: str) -> str:
        kind: str = self.graph.nodes[key]["kind"]
        return kind

    def with_artifact(self, artifact: Artifact) -> TurnGraph:
        """A copy whose node for ``artifact.key`` holds ``artifact`` (e.g. after redaction)."""
        graph = self.graph.copy()
        graph.nodes[artifact.key]["artifact"] = artifact
        return attrs.evolve(self, graph=graph)

    def with_node(self, artifact: Artifact) -> TurnGraph:
        """A copy with ``artifact`` as a node of its own (e.g. a cut of an attached one)."""
        graph = self.graph.copy()
        graph.add_node(artifact.key, kind="artifact", artifact=artifact)
        return attrs.evolve(self, graph=graph)

    def with_views(self) -> TurnGraph:
        """A copy with a derived-view node per placement (``key#form``)."""
        graph = self.graph.copy()
        for item in self.items:
            view = f"{item.key}#{item.form}"
            graph.add_node(view, kind="view", artifact=None)
            graph.add_edge(item.key, view, kind="view")
        return attrs.evolve(self, graph=graph)

    def keeping(self, keys: Iterable[str]) -> TurnGraph:
        """A copy whose graph holds only the nodes ``keys``, without the measured draft: what
        a step after the turn reads, without keeping the rest of the turn until it runs."""
        graph = nx.DiGraph()
        graph.add_nodes_from((key, self.graph.nodes[key]) for key in keys)
        return attrs.evolve(self, graph=graph, measured=None)

    def decide(self, *decisions: Decision) -> TurnGraph:
        return attrs.evolve(self, decisions=(*self.decisions, *decisions))

    def with_stat(self, name: str, value: int) -> TurnGraph:
        stats = tuple((k, v) for k, v in self.stats if k != name)
        return attrs.evolve(self, stats=(*stats, (name, value)))
