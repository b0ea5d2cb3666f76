"""The processor registry: one processor per attachment kind, plugins by entry point."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from pipeline import AttachmentSpec, PluginError, Processed, RegistryError, UnknownAttachmentKind
from pipeline._errors import AttachmentError

if TYPE_CHECKING:
    from processors._context import ProcessContext

__all__ = ["ENTRY_POINT_GROUP", "Processor", "Registry"]

ENTRY_POINT_GROUP = "lamina.processors"


class Processor(Protocol):
    """Turns one attachment spec of its ``kind`` into artifacts."""

    @property
    def kind(self) -> str: ...

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        """The spec from its script form, e.g. ``{"note": "a.md"}``; raise AttachmentError."""
        ...

    def process(self, spec: Any, ctx: ProcessContext) -> Processed: ...


class Registry:
    """Processors by kind. ``register`` refuses duplicates; ``default()`` adds plugins."""

    def __init__(self, processors: Iterable[Processor] = ()) -> None:
        self._processors: dict[str, Processor] = {}
        self.plugin_errors: list[PluginError] = []
        for processor in processors:
            self.register(processor)

    def register(self, processor: Processor) -> None:
        kind = processor.kind
        if not kind or not kind.replace("_", "").replace("-", "").isalnum():
            raise RegistryError(kind, "a kind must be a non-empty word")
        if kind in self._processors:
            raise RegistryError(kind, "a processor for this kind is already registered")
        self._processors[kind] = processor

    def get(self, kind: str) -> Processor:
        try:
            return self._processors[kind]
        except KeyError:
            raise UnknownAttachmentKind(kind, self.kinds()) from None

    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted(self._processors))

    def __contains__(self, kind: object) -> bool:
        return kind in self._processors

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        """Find the one registered kind among ``data``'s keys and let its processor parse."""
        if not isinstance(data, Mapping):
            raise AttachmentError(
                repr(data)[:60], 'an attachment must be a mapping like {"note": path}'
            )
        kinds = [k for k in data if k in self._processors]
        if len(kinds) > 1:
            raise AttachmentError(str(dict(data))[:80], f"names several kinds: {', '.join(kinds)}")
        if not kinds:
            first = next(iter(data), "(empty)")
            raise UnknownAttachmentKind(str(first), self.kinds())
        return self._processors[kinds[0]].parse(data)

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[PluginError]:
        """Register every installed plugin of ``group``; a broken one is reported and skipped."""
        errors: list[PluginError] = []
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            try:
                loaded = ep.load()
                processor = loaded() if isinstance(loaded, type) or _is_factory(loaded) else loaded
                self.register(processor)
            except Exception as exc:  # a plugin may fail in any way; report it by name
                errors.append(PluginError(ep.name, f"{type(exc).__name__}: {exc}"))
        self.plugin_errors.extend(errors)
        return errors

    @classmethod
    def builtin(cls) -> Registry:
        """The processors that ship with Lamina."""
        from processors._builtin import builtin_processors

        return cls(builtin_processors())

    @classmethod
    def default(cls) -> Registry:
        """Built-ins plus every installed ``lamina.processors`` plugin."""
        registry = cls.builtin()
        registry.load_entry_points()
        return registry


def _is_factory(obj: object) -> bool:
    return callable(obj) and not hasattr(obj, "process")


ProcessorFactory = Callable[[], Processor]
