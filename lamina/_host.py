"""What a host app calls: the core's Conversation with its edges filled in from a vault.

The core (``pipeline``) takes its sources and renderer as arguments; here they default
to the built-in processors over a vault folder and the XML renderer with every
registered processor's renderers, so ``Conversation("...", vault="notes")`` just works.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lamina.pipeline as pipeline
from lamina.pipeline import ConversationState, Envelope, SegmentRenderer, SourceResolver
from lamina.pipeline.errors import ArgumentError, ConfigError
from lamina.pipeline.sources import AttachmentKinds
from lamina.pipeline.store import ChatTranscript
from lamina.processors import Registry, Sources, Vault
from lamina.renderers import XmlRenderer, cached_prefix

__all__ = [
    "Conversation",
    "default_sources",
    "export_transcript",
    "import_transcript",
    "load_conversation",
    "parse_transcript",
    "rebuild_envelope",
    "rebuild_envelopes",
    "render_transcript",
    "renderer_for",
    "stateless_turn",
]


def default_sources(
    vault: str | Path | Vault | None = None, sources: SourceResolver | None = None
) -> SourceResolver:
    """``sources`` if given, else the built-in processors (and plugins) over ``vault``."""
    if sources is not None and vault is not None:
        raise ConfigError("vault", "give either vault= or sources=, not both")
    if vault is not None and not isinstance(vault, str | Path | Vault):
        raise ArgumentError("vault", f"must be a folder path, got {type(vault).__name__}")
    if sources is not None:
        return sources
    return Sources() if vault is None else Sources.for_vault(vault)


def renderer_for(sources: SourceResolver) -> SegmentRenderer:
    """The XML renderer with the sources' processor renderers (plugins too) registered."""
    xml = XmlRenderer()
    if isinstance(sources, Sources):
        for (source_type, form), fn in sources.view_renderers().items():
            xml.register(source_type, form, fn)
    return xml


def _edges(
    vault: str | Path | Vault | None,
    sources: SourceResolver | None,
    renderer: SegmentRenderer | None,
    *,
    meter: bool = True,
) -> dict[str, Any]:
    """The sources, renderer and (``meter``) cache meter a host's conversation is built
    with: each envelope's ``cache`` is measured by ``renderers.cached_prefix``, when first
    read."""
    resolved = default_sources(vault, sources)
    edges: dict[str, Any] = {"sources": resolved, "renderer": renderer or renderer_for(resolved)}
    if meter:
        edges["cache_meter"] = cached_prefix
    return edges


class Conversation(pipeline.Conversation):
    """``lamina.pipeline.Conversation`` that also takes ``vault=``, filling in sources,
    renderer and the cache meter: each envelope's ``cache`` is the prefix its request
    repeats of the last request this object built, as sent, the break's code and its
    sentence (``renderers.cached_prefix``).

    >>> conv = Conversation("You are terse.", vault="examples/vault")
    >>> env = conv.turn("Summarize this", attach=[{"note": "project-spec.md"}])
    >>> env.cache.tokens, env.cache.reason, env.cache.sentence  # doctest: +SKIP
    (0, 'first-turn', 'First request of the chat: nothing is cached yet.')
    >>> conv.reply("It is a spec.")
    """

    def __init__(
        self,
        system: str | pipeline.SystemPrompt = "",
        *,
        vault: str | Path | Vault | None = None,
        sources: SourceResolver | None = None,
        renderer: SegmentRenderer | None = None,
        **options: Any,
    ) -> None:
        super().__init__(system, **(_edges(vault, sources, renderer) | options))

    @classmethod
    def restore(
        cls,
        state: ConversationState,
        *,
        vault: str | Path | Vault | None = None,
        sources: SourceResolver | None = None,
        renderer: SegmentRenderer | None = None,
        **options: Any,
    ) -> Conversation:
        """``lamina.pipeline.Conversation.restore`` with ``vault=`` and default edges."""
        conv = super().restore(state, **(_edges(vault, sources, renderer) | options))
        assert isinstance(conv, Conversation)
        return conv


def load_conversation(
    store: pipeline.store.Store,
    conversation_id: str,
    *,
    vault: str | Path | Vault | None = None,
    sources: SourceResolver | None = None,
    renderer: SegmentRenderer | None = None,
    **options: Any,
) -> pipeline.Conversation:
    """``lamina.pipeline.store.load_conversation`` with ``vault=`` and default edges."""
    return pipeline.store.load_conversation(
        store, conversation_id, **(_edges(vault, sources, renderer) | options)
    )


def stateless_turn(
    store: pipeline.store.Store,
    conversation_id: str,
    text: str,
    attach: Sequence[Any] = (),
    *,
    vault: str | Path | Vault | None = None,
    sources: SourceResolver | None = None,
    renderer: SegmentRenderer | None = None,
    **options: Any,
) -> tuple[pipeline.Conversation, Envelope]:
    """``lamina.pipeline.store.stateless_turn`` (load, build the turn, save) with ``vault=``
    and default edges; ``start=`` (a ``lamina.Conversation``) begins a conversation with
    nothing saved."""
    return pipeline.store.stateless_turn(
        store, conversation_id, text, attach, **(_edges(vault, sources, renderer) | options)
    )


def rebuild_envelope(
    store: pipeline.store.Store,
    conversation_id: str,
    turn: int | None = None,
    *,
    vault: str | Path | Vault | None = None,
    sources: SourceResolver | None = None,
    renderer: SegmentRenderer | None = None,
    **options: Any,
) -> Envelope | None:
    """``lamina.pipeline.store.rebuild_envelope`` with ``vault=`` and default edges."""
    return pipeline.store.rebuild_envelope(
        store, conversation_id, turn, **(_edges(vault, sources, renderer) | options)
    )


def rebuild_envelopes(
    store: pipeline.store.Store,
    conversation_id: str,
    *,
    vault: str | Path | Vault | None = None,
    sources: SourceResolver | None = None,
    renderer: SegmentRenderer | None = None,
    **options: Any,
) -> tuple[Envelope | None, ...]:
    """``lamina.pipeline.store.rebuild_envelopes`` with ``vault=`` and default edges."""
    return pipeline.store.rebuild_envelopes(
        store, conversation_id, **(_edges(vault, sources, renderer) | options)
    )


def import_transcript(
    text: str,
    store: pipeline.store.Store,
    *,
    vault: str | Path | Vault | None = None,
    sources: SourceResolver | None = None,
    renderer: SegmentRenderer | None = None,
    **options: Any,
) -> pipeline.store.ImportReport:
    """``lamina.pipeline.store.import_transcript`` with ``vault=`` and default edges."""
    return pipeline.store.import_transcript(
        text, store, **(_edges(vault, sources, renderer, meter=False) | options)
    )


def export_transcript(
    store: pipeline.store.Store, conversation_id: str, *, kinds: AttachmentKinds | None = None
) -> str:
    """``lamina.pipeline.store.export_transcript`` naming kinds as their processors do
    (plugins too)."""
    return pipeline.store.export_transcript(store, conversation_id, kinds or Registry.default())


def render_transcript(transcript: ChatTranscript, *, kinds: AttachmentKinds | None = None) -> str:
    """``lamina.pipeline.store.render_transcript`` naming kinds as their processors do
    (plugins too)."""
    return pipeline.store.render_transcript(transcript, kinds or Registry.default())


def parse_transcript(
    text: str, path: str = "<transcript>", *, kinds: AttachmentKinds | None = None
) -> ChatTranscript:
    """``lamina.pipeline.store.parse_transcript`` reading categories as the processors name them."""
    return pipeline.store.parse_transcript(text, path, kinds or Registry.default())
