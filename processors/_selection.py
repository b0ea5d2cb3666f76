"""Selected (or pasted) text: non-recoverable, so it is keyed by its own content hash."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Self

import attrs

from lamina.pipeline.errors import AttachmentError, NotRebuilt
from lamina.pipeline.sources import LabelLookup, Processed, make_artifact
from lamina.pipeline.text import content_hash
from lamina.processors._context import ProcessContext
from lamina.processors._processor import BaseProcessor

__all__ = ["SelectionPayload", "SelectionProcessor", "SelectionSpec", "selection"]

_FIELDS = ("lines", "selection", "source")


@attrs.frozen
class SelectionPayload:
    """Text the user selected, with where it came from (a note path or URL) if known."""

    text: str
    source: str | None = None
    lines: tuple[int, int] | None = None

    @property
    def title(self) -> str:
        return f"selection from {self.source}" if self.source else "selection"

    @property
    def locator(self) -> str:
        """The source it was selected from; empty when unknown (it cannot be re-fetched)."""
        return self.source or ""

    def body(self) -> str:
        return self.text

    def attributes(self) -> tuple[tuple[str, str], ...]:
        attrs_: list[tuple[str, str]] = []
        if self.source:
            attrs_.append(("source", self.source))
        if self.lines:
            attrs_.append(("lines", f"{self.lines[0]}-{self.lines[1]}"))
        return tuple(attrs_)

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        return attrs.evolve(self, text=fn(self.text))


@attrs.frozen
class SelectionSpec:
    """Attach selected text; validated when built by ``selection()``."""

    payload: SelectionPayload

    @property
    def kind(self) -> str:
        return "selection"

    def describe(self) -> str:
        return f"selection ({len(self.payload.text)} chars{_from(self.payload)})"


def _from(payload: SelectionPayload) -> str:
    return f" from {payload.source}" if payload.source else ""


def _label(text: Any) -> str:
    if isinstance(text, str):
        return f"selection ({len(text)} chars)"
    return "selection"


def selection(
    text: str, source: str | None = None, lines: tuple[int, int] | list[int] | None = None
) -> SelectionSpec:
    """Spec for selected text, optionally with its source and 1-based inclusive line range."""
    label = _label(text)
    if not isinstance(text, str) or not text.strip():
        raise AttachmentError(label, "selected text must be a non-empty string")
    if source is not None and (not isinstance(source, str) or not source.strip()):
        raise AttachmentError(label, "source must be a non-empty string when given")
    span: tuple[int, int] | None = None
    if lines is not None:
        if (
            not isinstance(lines, (list, tuple))
            or len(lines) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in lines)
        ):
            raise AttachmentError(label, f"lines must be two integers [first, last], not {lines!r}")
        first, last = lines
        if first < 1 or last < first:
            raise AttachmentError(
                label, f"lines must satisfy 1 <= first <= last, not {first}-{last}"
            )
        span = (first, last)
    return SelectionSpec(SelectionPayload(text, source, span))


@attrs.frozen
class SelectionProcessor(BaseProcessor):
    """``{"selection": text, "source": p, "lines": [a, b]}``: one non-recoverable artifact."""

    category = "Selections"

    @property
    def kind(self) -> str:
        return "selection"

    def script_form(self, spec: SelectionSpec) -> dict[str, Any]:
        payload = spec.payload
        form: dict[str, Any] = {"selection": payload.text}
        if payload.source:
            form["source"] = payload.source
        if payload.lines:
            form["lines"] = list(payload.lines)
        return form

    def label(self, form: Mapping[str, Any]) -> str:
        """The artifact key: transcripts do not carry the selected text itself."""
        return _key(self.parse(form).payload)

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        stored = lookup.stored("selection", label)
        if stored is None:
            why = "selected text is not in the store (transcripts do not carry it)"
            raise NotRebuilt("selection", label, why)
        return dict(stored), label

    def parse(self, data: Mapping[str, Any]) -> SelectionSpec:
        extra = sorted(str(k) for k in data if k not in _FIELDS)
        if extra:
            raise AttachmentError(
                _label(data.get("selection")), f"unknown fields: {', '.join(extra)}"
            )
        return selection(data.get("selection"), data.get("source"), data.get("lines"))  # type: ignore[arg-type]

    def process(self, spec: SelectionSpec, ctx: ProcessContext) -> Processed:
        payload = spec.payload
        return Processed(
            artifacts=(make_artifact("selection", _key(payload), payload, recoverable=False),)
        )


def _key(payload: SelectionPayload) -> str:
    return f"selection:{content_hash(payload)[:16]}"
