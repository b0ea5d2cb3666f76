"""The processor registry: one processor per attachment kind, plugins by entry point.

A processor owns its kind: parsing its script form and writing it back, its label and
category in transcripts, its view renderers and its typed settings. ``Registry``
checks all of it at ``register`` (naming the plugin) and answers the core's
``AttachmentKinds`` questions by asking the kind's processor.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import attrs

from lamina.pipeline import AttachmentSpec, Form
from lamina.pipeline.errors import (
    AttachmentError,
    NotRebuilt,
    PluginError,
    RegistryError,
    UnknownAttachmentKind,
    UnknownSetting,
)
from lamina.pipeline.sources import LabelLookup
from lamina.processors._context import ProcessContext
from lamina.processors._processor import BaseProcessor, Processor, ViewRenderer

__all__ = [
    "ENTRY_POINT_GROUP",
    "BaseProcessor",
    "Processor",
    "Registry",
    "plugin_scans",
    "reload_plugins",
]

ENTRY_POINT_GROUP = "lamina.processors"


# Hook -> the positional arguments it is called with (pluggy-style signature check).
_HOOKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("parse", ("data",)),
    ("script_form", ("spec",)),
    ("label", ("form",)),
    ("from_label", ("label", "lookup", "ctx")),
    ("process", ("spec", "ctx")),
)


@attrs.frozen
class _Scan:
    """One scan of the installed plugins: what loaded (entry point, processor) and what not."""

    loaded: tuple[tuple[EntryPoint, Any], ...]
    errors: tuple[PluginError, ...]


_scan: _Scan | None = None
_scans = 0
_template: Registry | None = None


def plugin_scans() -> int:
    """How many times this process has scanned the installed plugins' entry points."""
    return _scans


def reload_plugins() -> None:
    """Forget the plugin scan: the next ``Registry.default()`` scans the installed
    distributions again (call it after installing or removing a plugin)."""
    global _scan, _template
    _scan = None
    _template = None


def _scan_plugins(group: str) -> _Scan:
    """Load every entry point of ``group``; a broken one becomes a PluginError by name."""
    global _scans
    _scans += 1
    loaded: list[tuple[EntryPoint, Any]] = []
    errors: list[PluginError] = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            target = ep.load()
            # An entry point names a processor instance, or a class / factory making one.
            is_instance = hasattr(target, "process") and not isinstance(target, type)
            loaded.append((ep, target if is_instance else target()))
        except Exception as exc:  # a plugin may fail in any way; report it by name
            errors.append(PluginError(ep.name, f"{type(exc).__name__}: {exc}{_origin(ep)}"))
    return _Scan(tuple(loaded), tuple(errors))


def _default_scan() -> _Scan:
    global _scan
    if _scan is None:
        _scan = _scan_plugins(ENTRY_POINT_GROUP)
    return _scan


class Registry:
    """Processors by kind, in registration order. ``register`` checks each processor's
    hooks and refuses duplicates; ``default()`` adds the installed plugins."""

    def __init__(self, processors: Iterable[Processor] = ()) -> None:
        self._processors: dict[str, Processor] = {}
        self._renderers: dict[tuple[str, Form], ViewRenderer] = {}
        self.plugin_errors: list[PluginError] = []
        for processor in processors:
            self.register(processor)

    def register(self, processor: Processor) -> None:
        """Add ``processor``; RegistryError (naming its kind and class) if a hook is
        missing or malformed, or its kind or a renderer is taken."""
        kind = processor.kind
        if not isinstance(kind, str) or not kind.replace("_", "").replace("-", "").isalnum():
            raise RegistryError(str(kind), "a kind must be a non-empty word")
        if kind in self._processors:
            raise RegistryError(kind, "a processor for this kind is already registered")
        _check_hooks(processor)
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

    # --- the core's AttachmentKinds, answered by each kind's processor ---------------

    def kind_of(self, form: Mapping[str, Any]) -> str:
        """The registered kind among the script form's keys, else its first key."""
        named = [k for k in self._processors if k in form]
        return named[0] if named else str(next(iter(form), ""))

    def script_form(self, spec: AttachmentSpec) -> dict[str, Any] | None:
        processor = self._processors.get(spec.kind)
        return None if processor is None else processor.script_form(spec)

    def label(self, kind: str, form: Mapping[str, Any]) -> str:
        processor = self._processors.get(kind)
        return str(form.get(kind, "")) if processor is None else processor.label(form)

    def category(self, kind: str) -> str:
        processor = self._processors.get(kind)
        return kind if processor is None else processor.category or kind

    def kind_named(self, category: str) -> str:
        name = category.strip()
        for kind, processor in self._processors.items():
            if (processor.category or kind) == name:
                return kind
        return name.lower() or "unknown"

    def order(self, kind: str) -> tuple[int, str]:
        kinds = list(self._processors)
        return (kinds.index(kind), "") if kind in kinds else (len(kinds), kind)

    def from_label(
        self, kind: str, label: str, lookup: LabelLookup, ctx: ProcessContext | None = None
    ) -> tuple[dict[str, Any], str]:
        processor = self._processors.get(kind)
        if processor is None:
            raise NotRebuilt(kind, label, "unknown context category")
        return processor.from_label(label, lookup, ctx or ProcessContext())

    # --- settings ----------------------------------------------------------------------

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Refuse an option no registered processor declares (``<kind>_<setting>``), with
        UnknownSetting naming it and the kind; each processor checks the values."""
        by_length = sorted(self._processors, key=len, reverse=True)
        for key in options:
            kind = next((k for k in by_length if key.startswith(k + "_")), "")
            known = _setting_names(kind, self._processors[kind].settings if kind else None)
            if key not in known:
                every = [
                    n for k, p in self._processors.items() for n in _setting_names(k, p.settings)
                ]
                raise UnknownSetting(key, kind, known if kind else sorted(every))

    # --- plugins -----------------------------------------------------------------------

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[PluginError]:
        """Register every installed plugin of ``group`` (scanning now); a broken one is
        reported and skipped."""
        return self._add_plugins(_scan_plugins(group))

    def _add_plugins(self, scan: _Scan) -> list[PluginError]:
        errors = list(scan.errors)
        for ep, processor in scan.loaded:
            try:
                self.register(processor)
            except Exception as exc:  # a plugin may fail in any way; report it by name
                errors.append(PluginError(ep.name, f"{type(exc).__name__}: {exc}{_origin(ep)}"))
        errors.sort(key=lambda e: e.plugin)
        self.plugin_errors.extend(errors)
        return errors

    @classmethod
    def builtin(cls) -> Registry:
        """The processors that ship with Lamina."""
        from lamina.processors._builtin import builtin_processors

        return cls(builtin_processors())

    @classmethod
    def default(cls, *, refresh: bool = False) -> Registry:
        """Built-ins plus every installed ``lamina.processors`` plugin.

        The installed plugins are scanned once per process; ``refresh=True`` scans again
        (after installing a plugin), as does ``reload_plugins()``.
        """
        global _template
        if refresh:
            reload_plugins()
        if _template is None:
            template = Registry.builtin()
            template._add_plugins(_default_scan())
            _template = template
        return cls._copy_of(_template)

    @classmethod
    def _copy_of(cls, other: Registry) -> Registry:
        """A registry with ``other``'s (already checked) processors, renderers and errors;
        registering into it leaves ``other`` as it was."""
        registry = cls()
        registry._processors = dict(other._processors)
        registry._renderers = dict(other._renderers)
        registry.plugin_errors = list(other.plugin_errors)
        return registry


def _setting_names(kind: str, settings: type | None) -> list[str]:
    if not kind or settings is None:
        return []
    return [f"{kind}_{a.name}" for a in attrs.fields(settings)]


def _check_hooks(processor: Processor) -> None:
    """Every hook present and callable with its arguments, every attribute well typed."""
    kind = processor.kind
    owner = f"{type(processor).__module__}.{type(processor).__qualname__}"
    for name, params in _HOOKS:
        hook = getattr(processor, name, None)
        if not callable(hook):
            raise RegistryError(
                kind,
                f"{owner} has no {name}() hook (subclass processors.BaseProcessor "
                "for the optional hooks' defaults)",
            )
        try:
            inspect.signature(hook).bind(*params)
        except TypeError:
            raise RegistryError(
                kind, f"{owner}.{name}() must take ({', '.join(params)})"
            ) from None
        except ValueError:  # a builtin without a signature: trusted
            pass
    category = getattr(processor, "category", None)
    if not isinstance(category, str):
        raise RegistryError(kind, f"{owner}.category must be a string")
    settings = getattr(processor, "settings", None)
    if settings is not None and not (isinstance(settings, type) and attrs.has(settings)):
        raise RegistryError(kind, f"{owner}.settings must be an attrs class or None")


def _renderers_of(processor: Processor) -> dict[tuple[str, Form], ViewRenderer]:
    """A processor's optional ``renderers``, checked: (source type, form) -> callable."""
    declared = getattr(processor, "renderers", None)
    kind = processor.kind
    if declared is None:
        raise RegistryError(
            kind,
            "has no renderers mapping (subclass processors.BaseProcessor for the default)",
        )
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
