"""The forms of an artifact (full, preview, summary, excerpt, reference), how they are cut to
a number of tokens, and the summarizers and the summary memo behind the summary form."""

from lamina.pipeline._views.preview import (
    EXCERPT_MIN_TOKENS,
    Boundary,
    Excerpt,
    Preview,
    cut_to_tokens,
    fit_preview,
    make_excerpt,
    make_preview,
)
from lamina.pipeline._views.summarize import (
    Complete,
    LLMSummarizer,
    PreparesSummaries,
    SummaryBacking,
    SummaryCache,
    SummaryKey,
    SummaryPool,
    SummaryResult,
    TextRankSummarizer,
    summary_pool,
)
from lamina.pipeline._views.views import (
    ViewMemo,
    carry_forward,
    excerpt_view,
    full_view,
    preview_view,
    reference_view,
    shared_views,
    summary_view,
)

__all__ = [
    "EXCERPT_MIN_TOKENS",
    "Boundary",
    "Complete",
    "Excerpt",
    "LLMSummarizer",
    "PreparesSummaries",
    "Preview",
    "SummaryBacking",
    "SummaryCache",
    "SummaryKey",
    "SummaryPool",
    "SummaryResult",
    "TextRankSummarizer",
    "ViewMemo",
    "carry_forward",
    "cut_to_tokens",
    "excerpt_view",
    "fit_preview",
    "full_view",
    "make_excerpt",
    "make_preview",
    "preview_view",
    "reference_view",
    "shared_views",
    "summary_pool",
    "summary_view",
]
