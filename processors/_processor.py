"""What a processor is: the hooks by which it owns its kind, and their defaults."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from lamina.pipeline import AttachmentSpec, View
from lamina.pipeline.sources import LabelLookup, Processed
from lamina.processors._context import ProcessContext

__all__ = ["BaseProcessor", "Processor", "ViewRenderer"]


ViewRenderer = Callable[[View], str]


class Processor(Protocol):
    """Turns one attachment spec of its ``kind`` into artifacts, and owns the kind.

    Every hook is required; ``BaseProcessor`` gives the optional ones their defaults.
    """

    @property
    def kind(self) -> str: ...

    @property
    def category(self) -> str:
        """The kind's group in a transcript's context line, e.g. ``Notes``."""
        ...

    @property
    def renderers(self) -> Mapping[tuple[str, str], ViewRenderer]:
        """``(source_type, form) -> fn(View) -> str`` for the segment renderer."""
        ...

    @property
    def settings(self) -> type | None:
        """An attrs class of the kind's settings (``ProcessContext.options`` keys
        ``<kind>_<field>``), or None when the kind has none."""
        ...

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        """The spec from its script form, e.g. ``{"note": "a.md"}``; raise AttachmentError."""
        ...

    def script_form(self, spec: Any) -> dict[str, Any]:
        """The spec written back as its script form: ``parse`` of it gives the spec."""
        ...

    def label(self, form: Mapping[str, Any]) -> str:
        """How transcripts name the attachment of this script form (path, URL, key)."""
        ...

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        """(script form, label to keep) from a transcript label; raise NotRebuilt."""
        ...

    def process(self, spec: Any, ctx: ProcessContext) -> Processed: ...


class BaseProcessor(abc.ABC):
    """A processor's optional hooks with their defaults; subclass it and define ``kind``,
    ``parse``, ``script_form`` and ``process``."""

    category: str = ""
    renderers: Mapping[tuple[str, str], ViewRenderer] = MappingProxyType({})
    settings: type | None = None

    @property
    @abc.abstractmethod
    def kind(self) -> str: ...

    @abc.abstractmethod
    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec: ...

    @abc.abstractmethod
    def script_form(self, spec: Any) -> dict[str, Any]: ...

    @abc.abstractmethod
    def process(self, spec: Any, ctx: ProcessContext) -> Processed: ...

    def label(self, form: Mapping[str, Any]) -> str:
        """The value of the kind's own field, e.g. the path of ``{"note": path}``."""
        return str(form.get(self.kind, ""))

    def from_label(
        self, label: str, lookup: LabelLookup, ctx: ProcessContext
    ) -> tuple[dict[str, Any], str]:
        """The script form a store kept under this label, else ``{kind: label}``."""
        stored = lookup.stored(self.kind, label)
        return (dict(stored) if stored is not None else {self.kind: label}), label
