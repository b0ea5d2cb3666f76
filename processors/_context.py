"""What a processor may use: the vault, network permissions and a per-conversation cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from pipeline import AttachmentSpec, Processed
from processors._registry import Registry
from processors._vault import Vault

if TYPE_CHECKING:
    from renderers import XmlRenderer

__all__ = ["ProcessContext", "Sources"]


@attrs.frozen
class ProcessContext:
    """Settings and shared state handed to every processor call."""

    vault: Vault | None = None
    allow_private_network: bool = False
    allow_absolute_paths: bool = False
    refresh: bool = False
    # Per-conversation cache (e.g. fetched pages by URL); shared by copies on purpose.
    cache: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    options: Mapping[str, Any] = attrs.field(factory=dict)


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

    def renderer(self) -> XmlRenderer:
        """The segment renderer with the registry's processor renderers (plugins too)."""
        return self.registry.renderer()

    def with_changes(self, changes: Mapping[str, str]) -> Sources:
        if not changes:
            return self
        if self.context.vault is None:
            from pipeline import ConfigError

            raise ConfigError("vault_changes", "there is no vault to change")
        vault = self.context.vault.with_changes(changes)
        return attrs.evolve(self, context=attrs.evolve(self.context, vault=vault))
