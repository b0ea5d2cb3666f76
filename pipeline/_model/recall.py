"""Recall's values: what the budget dropped, kept findable, and the blocks it sends back.

A ``RecallItem`` is one dropped history message (``history:12:user``) or one cut library
entry's full text (``note:a.md``); a ``Retriever`` ranks them for a query. A recalled
item is sent as a turn-scoped ``recalled`` block in this turn's user message (key
``recalled:`` + the item's key), like a retrieval chunk: never in L1, L2 or L4.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, Self, runtime_checkable

import attrs

from lamina.pipeline._model.artifacts import Artifact, make_artifact

__all__ = [
    "RECALL_SOURCE",
    "RecallItem",
    "Recalled",
    "Retriever",
    "recalled_artifact",
]

RECALL_SOURCE = "recalled"


@attrs.frozen
class RecallItem:
    """One thing the budget dropped: its key, the turn it is from, its text and title."""

    key: str
    turn: int
    text: str
    title: str = ""


@runtime_checkable
class Retriever(Protocol):
    """A ranker over recall items that a host can replace (embeddings, another index).

    ``index`` adds items (keys not indexed before); ``search`` returns at most ``k``
    ``(key, score)`` pairs, best first, for items that match ``query`` at all. For the
    same request live and restored, scores must depend only on the set of items indexed
    (not on the order they were added); ties are broken by key by the caller.
    """

    def index(self, items: Sequence[RecallItem]) -> None: ...

    def search(self, query: str, k: int) -> Sequence[tuple[str, float]]: ...


@attrs.frozen
class Recalled:
    """The payload of a recalled block: the item as it was when dropped."""

    of: str
    turn: int
    text: str
    label: str = ""

    @property
    def title(self) -> str:
        return self.label or self.of

    @property
    def locator(self) -> str:
        return self.of

    def body(self) -> str:
        return self.text

    def attributes(self) -> tuple[tuple[str, str], ...]:
        # Recalled history passages share one block; each line names its turn.
        return (("turn", str(self.turn)),) if self.turn else ()

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        return attrs.evolve(self, text=fn(self.text))


def recalled_artifact(item: RecallItem) -> Artifact:
    """``item`` as the turn-scoped artifact keyed ``recalled:<item key>``."""
    payload = Recalled(item.key, item.turn, item.text, item.title)
    return make_artifact(RECALL_SOURCE, f"{RECALL_SOURCE}:{item.key}", payload, recoverable=True)
