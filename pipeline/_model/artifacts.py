"""Typed artifacts: what every attachment becomes before any text is rendered."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self, cast, runtime_checkable

import attrs

from lamina.pipeline._errors import ArgumentError
from lamina.pipeline._hashing import content_hash

if TYPE_CHECKING:
    from lamina.pipeline._model.kinds import AttachmentKinds

__all__ = [
    "Artifact",
    "AttachmentSpec",
    "Link",
    "Payload",
    "Processed",
    "SourceResolver",
    "TurnWarning",
    "make_artifact",
    "resolver_for_turn",
]


@runtime_checkable
class Payload(Protocol):
    """What every source type's payload offers the generic stages and renderers."""

    @property
    def title(self) -> str: ...

    @property
    def locator(self) -> str:
        """Where the model or host can get the content again (path, URL, video id)."""
        ...

    def body(self) -> str:
        """The full content as markdown (headings kept, so previews keep structure)."""
        ...

    def attributes(self) -> tuple[tuple[str, str], ...]:
        """Extra rendered attributes besides key and title, in a fixed order."""
        ...

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        """A copy whose textual content is mapped through ``fn`` (for redaction stages)."""
        ...


@attrs.frozen
class Artifact:
    """One unit of context: identity (key), class (recoverable), content and its hash."""

    key: str
    source_type: str
    recoverable: bool
    payload: Payload
    content_hash: str

    @property
    def title(self) -> str:
        return self.payload.title

    @property
    def locator(self) -> str:
        return self.payload.locator

    def with_payload(self, payload: Payload) -> Artifact:
        """The same artifact holding ``payload``, with its hash recomputed."""
        return make_artifact(self.source_type, self.key, payload, recoverable=self.recoverable)


def make_artifact(source_type: str, key: str, payload: Payload, *, recoverable: bool) -> Artifact:
    """Build an artifact, hashing the canonical bytes of its source type and payload."""
    if not key.startswith(f"{source_type}:"):
        raise ArgumentError("key", f"artifact key {key!r} must start with {source_type + ':'!r}")
    digest = content_hash({"source_type": source_type, "payload": payload})
    return Artifact(key, source_type, recoverable, payload, digest)


class AttachmentSpec(Protocol):
    """What a host attaches: a kind (the processor's name) and its own fields."""

    @property
    def kind(self) -> str: ...

    def describe(self) -> str:
        """A short human label for errors and reports, e.g. ``note docs/a.md``."""
        ...


@attrs.frozen
class Link:
    """A provenance edge: ``source`` contains, links to or embeds ``target``."""

    source: str
    target: str
    kind: str  # "contains" | "links" | "embeds"
    inline: bool = False  # an embed whose target is placed after its source this turn


@attrs.frozen
class TurnWarning:
    """Something a processor or stage could not do as asked: a code for programs, the
    artifact key it concerns ("" if none) and one sentence for people."""

    code: str
    key: str
    message: str

    @classmethod
    def of(cls, value: TurnWarning | str | Mapping[str, Any]) -> TurnWarning:
        """A warning from itself, its plain form, or a bare sentence (older plugins, stores)."""
        if isinstance(value, TurnWarning):
            return value
        if isinstance(value, Mapping):
            return cls(str(value["code"]), str(value.get("key", "")), str(value["message"]))
        return cls("untyped", "", str(value))

    def __str__(self) -> str:
        where = f"{self.key}: " if self.key else ""
        return f"{where}{self.message} [{self.code}]"


def _warnings(values: Iterable[TurnWarning | str]) -> tuple[TurnWarning, ...]:
    return tuple(TurnWarning.of(v) for v in values)


@attrs.frozen
class Processed:
    """What one attachment spec produced: artifacts in order, an optional group, edges.

    ``embedded`` artifacts are not attachments of their own: each is placed right after
    the artifact that embeds it (an ``embeds`` link marked ``inline``)."""

    artifacts: tuple[Artifact, ...]
    group: str | None = None
    links: tuple[Link, ...] = ()
    warnings: tuple[TurnWarning, ...] = attrs.field(default=(), converter=_warnings)
    embedded: tuple[Artifact, ...] = ()


class SourceResolver(Protocol):
    """Turns specs into artifacts (I/O lives behind this); see ``lamina.processors.Sources``."""

    def process(self, spec: AttachmentSpec) -> Processed: ...

    def with_changes(self, changes: Mapping[str, str]) -> SourceResolver:
        """A resolver that sees ``changes`` (vault-relative path -> text) over its vault."""
        ...

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        """A spec from its script form, e.g. ``{"note": "a.md"}``."""
        ...

    @property
    def kinds(self) -> AttachmentKinds:
        """What the store and transcripts ask about these sources' attachment kinds."""
        ...


def resolver_for_turn(resolver: SourceResolver) -> SourceResolver:
    """The resolver to use for one turn's specs: ``resolver.for_turn()`` where it offers one
    (``lamina.processors.Sources`` does: it lists the vault once per turn), else ``resolver``."""
    for_turn = getattr(resolver, "for_turn", None)
    return resolver if for_turn is None else cast(SourceResolver, for_turn())
