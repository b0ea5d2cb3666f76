"""A bad argument to a public function is a LaminaError naming the argument, never a plain
ValueError or KeyError (it stays a ValueError too, for hosts that caught that before)."""

from __future__ import annotations

import pytest

from lamina.pipeline import Artifact, LaminaError
from lamina.pipeline.errors import ArgumentError
from lamina.pipeline.sources import make_artifact
from lamina.pipeline.tokens import TokenCounter
from lamina.pipeline.views import (
    SummaryCache,
    TextRankSummarizer,
    cut_to_tokens,
    make_excerpt,
    summary_view,
)
from lamina.processors import NotePayload
from lamina.renderers import Simulation


def _note(key: str = "note:a.md", *, recoverable: bool = True) -> Artifact:
    payload = NotePayload("a.md", "a", (), (), "# A\n\nSome text.\n", ())
    return make_artifact("note", key, payload, recoverable=recoverable)


def test_an_artifact_key_of_another_source_type() -> None:
    with pytest.raises(ArgumentError, match="must start with 'note:'") as caught:
        _note("pdf:a.md")
    assert caught.value.argument == "key" and isinstance(caught.value, ValueError)


def test_an_unknown_cut_boundary() -> None:
    with pytest.raises(ArgumentError, match="unknown 'clause'"):
        cut_to_tokens("Some text. " * 50, TokenCounter(), 5, boundary="clause")  # type: ignore[arg-type]


def test_an_excerpt_too_small_to_hold_its_marker() -> None:
    with pytest.raises(ArgumentError) as caught:
        make_excerpt("text", TokenCounter(), 1)
    assert caught.value.argument == "max_tokens"


def test_a_summary_of_a_non_recoverable_artifact() -> None:
    with pytest.raises(LaminaError, match="may only be excerpted"):
        summary_view(_note(recoverable=False), SummaryCache(), TextRankSummarizer(), 50)


def test_a_simulation_series_that_was_not_run() -> None:
    with pytest.raises(ArgumentError, match="no series for layout 'x'"):
        Simulation(()).get("x", "openai")
