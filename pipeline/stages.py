"""The built-in stages and what a stage of a host's own works with: the turn's context and
placements, page merging, the library entry a promotion makes, the render step and the
budget (``Solve``)."""

from lamina.pipeline._budget.objective import Solve
from lamina.pipeline._stages.builtin import Dedup, Expand, Promote, Reference, library_entry
from lamina.pipeline._stages.pages import MergePages, PagedPayload, format_pages, parse_pages
from lamina.pipeline._turn.assemble import assemble
from lamina.pipeline._turn.graph import Placement, TurnContext

__all__ = [
    "Dedup",
    "Expand",
    "MergePages",
    "PagedPayload",
    "Placement",
    "Promote",
    "Reference",
    "Solve",
    "TurnContext",
    "assemble",
    "format_pages",
    "library_entry",
    "parse_pages",
]
