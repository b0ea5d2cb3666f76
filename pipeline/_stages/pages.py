"""One page is sent once: overlapping page ranges of one document are cut to new pages."""

from __future__ import annotations

from typing import Protocol, Self, runtime_checkable

import attrs

from lamina.pipeline._model.artifacts import make_artifact
from lamina.pipeline._model.envelope import Decision, DecisionAction
from lamina.pipeline._model.library import Library
from lamina.pipeline._turn.graph import Placement, TurnGraph

__all__ = ["MergePages", "PagedPayload", "format_pages", "parse_pages"]


@runtime_checkable
class PagedPayload(Protocol):
    """A payload holding some pages of one document (a PDF): what ``MergePages`` needs."""

    @property
    def locator(self) -> str: ...

    @property
    def document(self) -> str:
        """The document's path: payloads of one document share it."""
        ...

    @property
    def page_count(self) -> int: ...

    def page_numbers(self) -> tuple[int, ...]:
        """The pages this payload holds, ascending."""
        ...

    def only_pages(self, pages: tuple[int, ...]) -> Self:
        """This payload cut to ``pages`` (a subset of ``page_numbers()``)."""
        ...


def parse_pages(text: str) -> set[int]:
    """The page numbers of a canonical range text like ``1-3,7``."""
    pages: set[int] = set()
    for term in filter(None, text.split(",")):
        first, _, last = term.partition("-")
        pages.update(range(int(first), int(last or first) + 1))
    return pages


def format_pages(pages: set[int] | tuple[int, ...]) -> str:
    """``1-3,7`` for {1, 2, 3, 7}."""
    spans: list[list[int]] = []
    for n in sorted(pages):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _held(library: Library, source_type: str, payload: PagedPayload) -> dict[str, set[int]]:
    """The pages of ``payload``'s document that L2 entries hold, by entry key."""
    held: dict[str, set[int]] = {}
    for entry in library:
        view = entry.view
        attributes = dict(view.attributes)
        if view.source_type != source_type or attributes.get("path") != payload.document:
            continue
        pages = attributes.get("pages")
        held[entry.key] = (
            parse_pages(pages) if pages else set(range(1, payload.page_count + 1))
        )
    return held


@attrs.frozen
class MergePages:
    """Cut each paged attachment (a PDF page range) to the pages neither L2 nor an earlier
    item of this turn holds: the cut is an artifact (and later a library entry) of its own,
    so each page set is one entry and no page is sent twice. An attachment whose pages are
    all held is dropped; its own key, if L2 holds it, is left to ``reference``."""

    name: str = "pages"
    after: tuple[str, ...] = ("dedup",)
    before: tuple[str, ...] = ("reference",)

    def __call__(self, turn: TurnGraph) -> TurnGraph:
        placed: dict[str, set[int]] = {}
        items: list[Placement] = []
        decisions: list[Decision] = []
        out = turn
        for item in turn.items:
            artifact = turn.artifact(item.key)
            payload = artifact.payload
            # The key test first: a runtime protocol check inspects the payload's members.
            if item.key in turn.library or not isinstance(payload, PagedPayload):
                items.append(item)
                continue
            pages = set(payload.page_numbers())
            sent = placed.setdefault(payload.document, set())
            held = _held(turn.library, artifact.source_type, payload)
            covered = sent.union(*held.values()) & pages
            sent.update(pages)
            if not covered:
                items.append(item)
                continue
            where = sorted(k for k, p in held.items() if p & pages) or ["this turn"]
            reason = f"pages {format_pages(covered)} already sent ({', '.join(where)})"
            new = tuple(sorted(pages - covered))
            if not new:
                dropped = DecisionAction.DROPPED
                decisions.append(
                    Decision(self.name, item.key, "full", "dropped", reason, action=dropped)
                )
                continue
            cut = payload.only_pages(new)
            key = f"{artifact.source_type}:{cut.locator}"
            fresh = make_artifact(artifact.source_type, key, cut, recoverable=artifact.recoverable)
            out = out.with_node(fresh)
            marks = (*item.marks, ("pages-sent-before", format_pages(covered)))
            items.append(attrs.evolve(item, key=key, marks=marks))
            why = f"{reason}; sent {key}"
            decisions.append(
                Decision(self.name, item.key, "full", "cut", why, action=DecisionAction.PAGES_CUT)
            )
        return attrs.evolve(out, items=tuple(items)).decide(*decisions)
