"""The edge where attachment specs become artifacts: a registry of processors plus a context."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from pipeline import AttachmentSpec, ConfigError, Form, Processed, View
from processors._context import ProcessContext
from processors._registry import Registry
from processors._vault import Vault

__all__ = ["Sources"]


@attrs.frozen
class Sources:
    """The edge where attachments become artifacts: a registry plus a context."""

    registry: Registry = attrs.field(factory=Registry.default, eq=False)
    context: ProcessContext = attrs.field(factory=ProcessContext)

    @classmethod
    def for_vault(cls, vault: str | Any, **options: Any) -> Sources:
        """Sources over a vault folder; ``options`` are ProcessContext fields."""
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
