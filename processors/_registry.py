"""The processor registry: one processor per attachment kind, plugins by entry point."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol

from pipeline import (
    AttachmentError,
    AttachmentSpec,
    Form,
    PluginError,
    Processed,
    RegistryError,
    UnknownAttachmentKind,
    View,
)

if TYPE_CHECKING:
    from processors._context import ProcessContext

__all__ = ["ENTRY_POINT_GROUP", "Processor", "Registry"]

ENTRY_POINT_GROUP = "lamina.processors"


ViewRenderer = Callable[[View], str]


class Processor(Protocol):
    """Turns one attachment spec of its ``kind`` into artifacts.

    A processor may also have ``renderers``: a mapping ``(source_type, form) -> fn(View)
    -> str`` that the registry hands to the segment renderer (see ``Registry.view_renderers``).
    """

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
        self._renderers: dict[tuple[str, Form], ViewRenderer] = {}
        self.plugin_errors: list[PluginError] = []
        for processor in processors:
            self.register(processor)

    def register(self, processor: Processor) -> None:
        kind = processor.kind
        if not kind or not kind.replace("_", "").replace("-", "").isalnum():
            raise RegistryError(kind, "a kind must be a non-empty word")
        if kind in self._processors:
            raise RegistryError(kind, "a processor for this kind is already registered")
        renderers = _renderers_of(processor)
        taken = [f"{t}/{f}" for t, f in renderers if (t, f) in self._renderers]
        if taken:
            raise RegistryError(kind, f"a renderer is already registered for {', '.join(taken)}")
        self._processors[kind] = processor
        self._renderers.update(renderers)

    def view_renderers(self) -> Mapping[tuple[str, Form], ViewRenderer]:
        """Every registered processor's renderers: (source type, form) -> fn(View) -> str.

        The application hands them to its segment renderer (``lamina.renderer_for``).
        """
        return dict(self._renderers)

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
                # An entry point names a processor instance, or a class / factory making one.
                is_instance = hasattr(loaded, "process") and not isinstance(loaded, type)
                processor = loaded if is_instance else loaded()
                self.register(processor)
            except Exception as exc:  # a plugin may fail in any way; report it by name
                problem = f"{type(exc).__name__}: {exc}{_origin(ep)}"
                errors.append(PluginError(ep.name, problem))
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


def _renderers_of(processor: Processor) -> dict[tuple[str, Form], ViewRenderer]:
    """A processor's optional ``renderers``, checked: (source type, form) -> callable."""
    declared = getattr(processor, "renderers", None)
    if declared is None:
        return {}
    kind = processor.kind
    if not isinstance(declared, Mapping):
        raise RegistryError(kind, "renderers must be a mapping (source_type, form) -> function")
    found: dict[tuple[str, Form], ViewRenderer] = {}
    for key, fn in declared.items():
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str)):
            raise RegistryError(kind, f"renderer key {key!r} is not (source_type, form)")
        try:
            form = Form(key[1])
        except ValueError:
            known = ", ".join(str(f) for f in Form)
            raise RegistryError(kind, f"renderer form {key[1]!r} is not one of {known}") from None
        if not callable(fn):
            raise RegistryError(kind, f"renderer for {key[0]}/{form} is not callable")
        found[(key[0], form)] = fn
    return found


def _origin(ep: EntryPoint) -> str:
    """`` (from <distribution> <version>)``, so the user knows which package to fix."""
    dist = ep.dist
    return f" (from {dist.name} {dist.version})" if dist is not None else ""
