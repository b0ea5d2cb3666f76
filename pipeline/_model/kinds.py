"""What the store and transcripts ask about attachment kinds; ``processors.Registry`` answers.

The core never imports processors: a conversation's sources hand it their kinds
(``SourceResolver.kinds``). Each question is answered by the processor that owns the
kind (its script form, its label and category in transcripts, rebuilding from a label);
a core without processors (``NoKinds``) knows no kind and labels them by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from lamina.pipeline._errors import NotRebuilt
from lamina.pipeline._model.artifacts import AttachmentSpec

__all__ = ["AttachmentKinds", "LabelLookup", "NoKinds"]


def _nothing_stored(kind: str, label: str) -> Mapping[str, Any] | None:
    return None


@attrs.frozen
class LabelLookup:
    """What rebuilding an attachment from its transcript label may consult: whether it may
    fetch from the network, and the script form a store kept for a (kind, label)."""

    allow_fetch: bool = False
    stored: Callable[[str, str], Mapping[str, Any] | None] = _nothing_stored


class AttachmentKinds(Protocol):
    """The per-kind knowledge persistence needs, dispatched to each kind's processor."""

    def kind_of(self, form: Mapping[str, Any]) -> str:
        """The kind a script form names, e.g. ``"note"`` for ``{"note": "a.md"}``."""
        ...

    def script_form(self, spec: AttachmentSpec) -> dict[str, Any] | None:
        """The spec written back as its script form (parsing it gives the spec again);
        None for a kind nobody registered."""
        ...

    def label(self, kind: str, form: Mapping[str, Any]) -> str:
        """How transcripts and context lines name the attachment (a path, URL, key)."""
        ...

    def category(self, kind: str) -> str:
        """The kind's group in a transcript's context line, e.g. ``Notes``."""
        ...

    def kind_named(self, category: str) -> str:
        """The kind a context-line category (or kind name) stands for."""
        ...

    def order(self, kind: str) -> tuple[int, str]:
        """Where the kind's group goes in a context line (registered kinds first)."""
        ...

    def from_label(self, kind: str, label: str, lookup: LabelLookup) -> tuple[dict[str, Any], str]:
        """(script form, label to keep) rebuilt from a transcript label; NotRebuilt if not."""
        ...


class NoKinds:
    """The kinds of a core without processors: none, each labelled by its own name."""

    def kind_of(self, form: Mapping[str, Any]) -> str:
        return str(next(iter(form), ""))

    def script_form(self, spec: AttachmentSpec) -> dict[str, Any] | None:
        return None

    def label(self, kind: str, form: Mapping[str, Any]) -> str:
        return str(form.get(kind, ""))

    def category(self, kind: str) -> str:
        return kind

    def kind_named(self, category: str) -> str:
        return category.strip().lower() or "unknown"

    def order(self, kind: str) -> tuple[int, str]:
        return (0, kind)

    def from_label(self, kind: str, label: str, lookup: LabelLookup) -> tuple[dict[str, Any], str]:
        raise NotRebuilt(kind, label, "unknown context category")
