"""A conversation: L1 sections, the L2 library and L4 history kept between turns."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from pipeline._artifacts import AttachmentSpec, Processed, SourceResolver
from pipeline._envelope import (
    BuildReport,
    Decision,
    Envelope,
    Form,
    Layer,
    LayerName,
    Segment,
    system_parts,
    user_parts,
)
from pipeline._errors import ConfigError, ConversationError
from pipeline._graph import TurnContext, TurnGraph
from pipeline._hashing import text_hash
from pipeline._history import HistoryEntry, strip_reply
from pipeline._library import Library, LibraryEntry
from pipeline._stages import Pipeline
from pipeline._tokens import TokenCounter
from pipeline._views import (
    Policy,
    SegmentRenderer,
    excerpt_view,
    full_view,
    preview_view,
    reference_view,
)

__all__ = [
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "Conversation",
    "ConversationState",
    "SystemPrompt",
    "request_tokens",
]

# OpenAI chat framing: every message costs 3 tokens, and the reply is primed with 3.
MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3


@attrs.frozen
class SystemPrompt:
    """L1: a stable contract and an optional mutable part (memory, project overlays)."""

    stable: str = ""
    mutable: str = ""


Attachment = AttachmentSpec | Mapping[str, Any]


@attrs.frozen
class ConversationState:
    """Everything a conversation carries between turns, as plain typed data.

    A store saves this (cattrs unstructures it generically) and ``Conversation.restore``
    rebuilds a conversation whose next turn is byte-identical to the uninterrupted one.
    """

    system: SystemPrompt
    library: tuple[LibraryEntry, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    vault_changes: tuple[tuple[str, str], ...] = ()
    last_system: SystemPrompt | None = None
    tokenizer: str = "o200k_base"
    policy: Policy = attrs.field(factory=Policy)


class Conversation:
    """Builds one envelope per turn and carries L1, L2 and L4 to the next.

    >>> conv = Conversation("You are terse.", vault="examples/vault")
    >>> env = conv.turn("Summarize this", attach=[{"note": "project-spec.md"}])
    >>> conv.reply("It is a spec.")
    """

    def __init__(
        self,
        system: str | SystemPrompt = "",
        *,
        vault: str | Path | None = None,
        sources: SourceResolver | None = None,
        tokenizer: str = "o200k_base",
        policy: Policy | None = None,
        pipeline: Pipeline | None = None,
        renderer: SegmentRenderer | None = None,
    ) -> None:
        if sources is not None and vault is not None:
            raise ConfigError("vault", "give either vault= or sources=, not both")
        self._system = system if isinstance(system, SystemPrompt) else SystemPrompt(system)
        self._sources = sources if sources is not None else _default_sources(vault)
        self.counter = TokenCounter(tokenizer)
        self.policy = policy or Policy()
        self.pipeline = pipeline or Pipeline.default()
        self.renderer = renderer if renderer is not None else _default_renderer()
        self._library = Library()
        self._history: list[HistoryEntry] = []
        self._last_system: SystemPrompt | None = None
        self._vault_changes: dict[str, str] = {}

    @property
    def state(self) -> ConversationState:
        return ConversationState(
            system=self._system,
            library=self._library.entries,
            history=tuple(self._history),
            vault_changes=tuple(sorted(self._vault_changes.items())),
            last_system=self._last_system,
            tokenizer=self.counter.name,
            policy=self.policy,
        )

    @classmethod
    def restore(
        cls,
        state: ConversationState,
        *,
        vault: str | Path | None = None,
        sources: SourceResolver | None = None,
        pipeline: Pipeline | None = None,
        renderer: SegmentRenderer | None = None,
    ) -> Conversation:
        """A conversation that continues exactly where ``state`` was taken."""
        conv = cls(
            state.system,
            vault=vault,
            sources=sources,
            tokenizer=state.tokenizer,
            policy=state.policy,
            pipeline=pipeline,
            renderer=renderer,
        )
        if state.vault_changes:
            conv._vault_changes = dict(state.vault_changes)
            conv._sources = conv._sources.with_changes(conv._vault_changes)
        conv._library = Library(state.library)
        conv._history = list(state.history)
        conv._last_system = state.last_system
        return conv

    @property
    def library(self) -> Library:
        return self._library

    @property
    def history(self) -> tuple[HistoryEntry, ...]:
        return tuple(self._history)

    @property
    def system(self) -> SystemPrompt:
        return self._system

    @property
    def sources(self) -> SourceResolver:
        return self._sources

    def set_system(self, stable: str | None = None, mutable: str | None = None) -> None:
        """Change L1; a change of the stable part invalidates every cached prefix."""
        self._system = SystemPrompt(
            self._system.stable if stable is None else stable,
            self._system.mutable if mutable is None else mutable,
        )

    def turn(
        self,
        text: str,
        attach: Iterable[Attachment] = (),
        *,
        vault_changes: Mapping[str, str] | None = None,
    ) -> Envelope:
        """Build this turn's envelope from the query and its attachments."""
        if vault_changes:
            self._sources = self._sources.with_changes(vault_changes)
            self._vault_changes.update(vault_changes)
        specs = [self._sources.parse(a) if isinstance(a, Mapping) else a for a in attach]
        processed = [self._sources.process(spec) for spec in specs]
        number = len(self._history) + 1
        ctx = TurnContext(number, self.counter, self.renderer, self.policy)
        graph = self.pipeline.run(TurnGraph.build(processed, ctx, self._library))
        envelope = self._assemble(graph, text)
        self._library = graph.promoted if graph.promoted is not None else graph.library
        self._history.append(HistoryEntry(number, text))
        self._last_system = self._system
        return envelope

    def reply(self, text: str) -> None:
        """Record the assistant's answer to the last turn (context blocks stripped)."""
        if not self._history:
            raise ConversationError("reply() was called before any turn")
        last = self._history[-1]
        if last.assistant is not None:
            raise ConversationError(f"turn {last.turn} already has a reply")
        self._history[-1] = attrs.evolve(last, assistant=strip_reply(text))

    def process(self, spec: Attachment) -> Processed:
        """Run one attachment through the sources (for hosts that inspect artifacts)."""
        parsed = self._sources.parse(spec) if isinstance(spec, Mapping) else spec
        return self._sources.process(parsed)

    # -- assembly: the render step -------------------------------------------------

    def _text_segment(self, key: str, source_type: str, text: str, role: str = "") -> Segment:
        return Segment(
            key=key,
            form=Form.TEXT,
            source_type=source_type,
            content_hash=text_hash(text),
            text=text,
            tokens=self.counter.count(text),
            role=role,
        )

    def _layer(self, name: LayerName, segments: Sequence[Segment]) -> Layer:
        return Layer(name, tuple(segments), self.counter.count_joined([s.text for s in segments]))

    def _assemble(self, graph: TurnGraph, query: str) -> Envelope:
        l1 = [
            self._text_segment(f"system:{part}", "system", text)
            for part, text in (("stable", self._system.stable), ("mutable", self._system.mutable))
            if text
        ]
        l2 = [
            Segment(
                key=e.key,
                form=e.form,
                source_type=e.view.source_type,
                content_hash=e.content_hash,
                text=e.text,
                tokens=e.tokens,
                title=e.view.title,
                locator=e.view.locator,
                recoverable=e.view.recoverable,
            )
            for e in graph.library
        ]
        l3_refs: list[Segment] = []
        l3_full: list[Segment] = []
        for item in graph.items:
            artifact = graph.artifact(item.key)
            if item.form is Form.REFERENCE:
                view = reference_view(artifact, item.marks)
            elif item.form is Form.PREVIEW:
                view = preview_view(artifact, self.counter, self.policy, item.marks)
            elif item.form is Form.EXCERPT:
                view = excerpt_view(artifact, self.counter, self.policy.verbatim_tokens, item.marks)
            else:
                view = full_view(artifact, item.marks)
            text = self.renderer.render(view)
            segment = Segment(
                key=view.key,
                form=view.form,
                source_type=view.source_type,
                content_hash=view.content_hash,
                text=text,
                tokens=self.counter.count(text),
                title=view.title,
                locator=view.locator,
                recoverable=view.recoverable,
            )
            (l3_refs if view.form is Form.REFERENCE else l3_full).append(segment)
        l4: list[Segment] = []
        for h in self._history:
            l4.append(self._text_segment(f"history:{h.turn}:user", "history", h.user, "user"))
            if h.assistant is not None:
                l4.append(
                    self._text_segment(
                        f"history:{h.turn}:assistant", "history", h.assistant, "assistant"
                    )
                )
        l5 = [self._text_segment("query", "query", query, "user")]
        decisions = list(graph.decisions)
        if self._last_system is not None and self._last_system != self._system:
            changed = "stable" if self._last_system.stable != self._system.stable else "mutable"
            decisions.insert(
                0,
                Decision(
                    "system",
                    f"system:{changed}",
                    "text",
                    "text",
                    "system prompt changed",
                    layer="L1",
                ),
            )
        layers = (
            self._layer(LayerName.L1, l1),
            self._layer(LayerName.L2, l2),
            self._layer(LayerName.L3, [*l3_refs, *l3_full]),
            self._layer(LayerName.L4, l4),
            self._layer(LayerName.L5, l5),
        )
        report = BuildReport(
            turn=graph.ctx.turn,
            attached=tuple(i.key for i in graph.items),
            decisions=tuple(decisions),
            warnings=graph.warnings,
            stats=graph.stats,
        )
        envelope = Envelope(graph.ctx.turn, layers, report)
        return envelope

    def request_tokens(self, envelope: Envelope) -> int:
        return request_tokens(envelope, self.counter)


def request_tokens(envelope: Envelope, counter: TokenCounter) -> int:
    """Exact tokens of the chat request (contents + per-message framing + reply priming)."""
    total = REPLY_PRIMING
    system = system_parts(envelope.l1, envelope.l2)
    if system:
        total += counter.count_joined(system) + MESSAGE_OVERHEAD
    for segment in envelope.l4.segments:
        total += segment.tokens + MESSAGE_OVERHEAD
    total += counter.count_joined(user_parts(envelope.l3, envelope.l5)) + MESSAGE_OVERHEAD
    return total


def _default_sources(vault: str | Path | None) -> SourceResolver:
    from processors import Sources, Vault

    if vault is None:
        return Sources()
    return Sources.for_vault(Vault(vault))


def _default_renderer() -> SegmentRenderer:
    from renderers import XmlRenderer

    return XmlRenderer()
