"""A measured draft of a turn: what the budget stage fits, before it is an envelope."""

from __future__ import annotations

import attrs

from lamina.pipeline._model.artifacts import Artifact
from lamina.pipeline._model.envelope import LayerName, Segment
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._model.library import Library
from lamina.pipeline._turn.graph import HistoryView, Placement, SystemPrompt

__all__ = ["Draft", "DraftLayer", "ItemBlock"]


@attrs.frozen
class DraftLayer:
    """One layer as measured: its segments (rendered text, exact tokens) and the exact
    count of their blocks joined; no joined text, no hash (``complete`` makes those)."""

    name: LayerName
    segments: tuple[Segment, ...]
    tokens: int


@attrs.frozen
class ItemBlock:
    """An L3 placement, the artifact it was rendered from and its segment: reused as is
    by the next draft when neither changed."""

    placement: Placement
    artifact: Artifact
    segment: Segment
    with_sep: int | None
    """Tokens of the segment's text followed by a blank line (None: only a whole count of
    the joined blocks tells), so the layer and the user message add blocks' counts."""


@attrs.frozen
class Draft:
    """A turn's five layers as measured (segments and exact counts) and what they were
    rendered from, so a cut re-renders only the blocks it changed and the render step
    completes the envelope when no later stage changed an input."""

    turn: int
    layers: tuple[DraftLayer, DraftLayer, DraftLayer, DraftLayer, DraftLayer]
    items: tuple[ItemBlock, ...]
    library: Library
    system: SystemPrompt
    history: tuple[HistoryEntry, ...]
    history_view: HistoryView
    query: str

    @property
    def inputs(self) -> tuple[object, ...]:
        """What the layers were rendered from, as ``TurnGraph.render_inputs`` lists them."""
        placements = tuple(block.placement for block in self.items)
        return (placements, self.library, self.system, self.history, self.history_view, self.query)

    @property
    def l1(self) -> DraftLayer:
        return self.layers[0]

    @property
    def l2(self) -> DraftLayer:
        return self.layers[1]

    @property
    def l3(self) -> DraftLayer:
        return self.layers[2]

    @property
    def l4(self) -> DraftLayer:
        return self.layers[3]

    @property
    def l5(self) -> DraftLayer:
        return self.layers[4]

    def with_sep(self) -> dict[str, int | None]:
        """Each L3 segment's tokens followed by a blank line, by key."""
        return {b.segment.key: b.with_sep for b in self.items}

    def layer_tokens(self) -> tuple[tuple[str, int], ...]:
        return tuple((str(layer.name), layer.tokens) for layer in self.layers)
