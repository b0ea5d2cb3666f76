"""The edge where attachment specs become artifacts: a registry of processors plus a context."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from lamina.pipeline import AttachmentSpec, Form, View
from lamina.pipeline.errors import ConfigError, UnknownSetting
from lamina.pipeline.sources import LabelLookup, Processed
from lamina.processors._context import ProcessContext
from lamina.processors._registry import Registry
from lamina.processors._vault import Vault

__all__ = ["Sources"]


@attrs.frozen
class Sources:
    """The edge where attachments become artifacts: a registry plus a context.

    Also the core's ``AttachmentKinds`` for the store and transcripts (``kinds``): the
    registry's answers, with this context for rebuilding attachments from labels.
    """

    registry: Registry = attrs.field(factory=Registry.default, eq=False)
    context: ProcessContext = attrs.field(factory=ProcessContext)

    def __attrs_post_init__(self) -> None:
        self.registry.check_options(self.context.options)

    @classmethod
    def for_vault(cls, vault: str | Any, **options: Any) -> Sources:
        """Sources over a vault folder; ``options`` are ProcessContext fields (a name that
        is none is an UnknownSetting)."""
        fields = [a.name for a in attrs.fields(ProcessContext) if a.name not in ("vault", "cache")]
        for name in options:
            if name not in fields:
                raise UnknownSetting(name, "", fields)
        v = vault if isinstance(vault, Vault) else Vault(vault)
        return cls(context=ProcessContext(vault=v, **options))

    def process(self, spec: AttachmentSpec) -> Processed:
        return self.registry.get(spec.kind).process(spec, self.context)

    def for_turn(self) -> Sources:
        """These sources with the vault listed at most once (see ``Vault.snapshot``)."""
        if self.context.vault is None:
            return self
        vault = self.context.vault.snapshot(self.context.cache)
        return attrs.evolve(self, context=attrs.evolve(self.context, vault=vault))

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        return self.registry.parse(data)

    @property
    def kinds(self) -> Sources:
        """These sources as the core's ``AttachmentKinds``, the vault listed at most once."""
        return self.for_turn()

    def kind_of(self, form: Mapping[str, Any]) -> str:
        return self.registry.kind_of(form)

    def script_form(self, spec: AttachmentSpec) -> dict[str, Any] | None:
        return self.registry.script_form(spec)

    def label(self, kind: str, form: Mapping[str, Any]) -> str:
        return self.registry.label(kind, form)

    def category(self, kind: str) -> str:
        return self.registry.category(kind)

    def kind_named(self, category: str) -> str:
        return self.registry.kind_named(category)

    def order(self, kind: str) -> tuple[int, str]:
        return self.registry.order(kind)

    def from_label(self, kind: str, label: str, lookup: LabelLookup) -> tuple[dict[str, Any], str]:
        return self.registry.from_label(kind, label, lookup, self.context)

    def view_renderers(self) -> Mapping[tuple[str, Form], Callable[[View], str]]:
        """The registry's processor renderers (plugins too), for the segment renderer."""
        return self.registry.view_renderers()

    def with_changes(self, changes: Mapping[str, str]) -> Sources:
        if not changes:
            return self
        if self.context.vault is None:
            raise ConfigError("vault_changes", "there is no vault to change")
        vault = self.context.vault.with_changes(changes)
        return attrs.evolve(self, context=attrs.evolve(self.context, vault=vault))
