"""Tool results and retrieval chunks: turn-scoped artifacts that never enter L1, L2 or L4.

A tool result is keyed ``tool:<name>:<first 16 hex of the hash of its canonical JSON
arguments>``; a retrieval chunk by its source key and line range
(``note:docs/a.md#L10-40``). Both go into this turn's user message only: tool results
first, then references, new context and the query ("context, then question").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self

import attrs

from lamina.pipeline._errors import AttachmentError
from lamina.pipeline._hashing import text_hash
from lamina.pipeline._input.safeload import LoadError, load_json
from lamina.pipeline._model.artifacts import (
    Artifact,
    AttachmentSpec,
    Processed,
    SourceResolver,
    make_artifact,
    resolver_for_turn,
)
from lamina.pipeline._model.envelope import TOOL_SOURCE
from lamina.pipeline._model.kinds import AttachmentKinds
from lamina.pipeline._model.recall import RECALL_SOURCE

__all__ = [
    "TOOL_SOURCE",
    "Chunk",
    "Hit",
    "Hits",
    "ToolResult",
    "ToolSources",
    "ToolUse",
    "canonical_args",
    "chunk_artifact",
    "chunk_key",
    "chunk_source",
    "hit",
    "hits",
    "is_turn_scoped",
    "tool",
    "tool_artifact",
    "tool_key",
]

_CHUNK_KEY = re.compile(r"^(?P<source>[a-z][\w-]*:.+)#L(?P<start>\d+)-(?P<end>\d+)$")


def canonical_args(args: Mapping[str, Any] | str) -> str:
    """Arguments as canonical JSON (sorted keys, compact, UTF-8); a JSON string is re-read."""
    value: Any = args
    if isinstance(args, str):
        try:
            value = load_json(args) if args.strip() else {}
        except LoadError as exc:
            problem = exc.problem.replace("not valid JSON", "not JSON")
            raise AttachmentError(f"tool arguments {args[:60]!r}", problem) from None
    if not isinstance(value, Mapping):
        raise AttachmentError(
            "tool arguments", f"must be a JSON object, got {type(value).__name__}"
        )
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise AttachmentError("tool arguments", f"not JSON-serializable: {exc}") from None


def tool_key(name: str, args: Mapping[str, Any] | str) -> str:
    """``tool:<name>:<16 hex>``: the same call (name + canonical args) has the same key."""
    return f"{TOOL_SOURCE}:{name}:{text_hash(canonical_args(args))[:16]}"


def chunk_key(source: str, start: int, end: int) -> str:
    return f"{source}#L{start}-{end}"


def chunk_source(key: str) -> str | None:
    """The source key of a chunk key (``note:a.md#L1-9`` -> ``note:a.md``), else None."""
    match = _CHUNK_KEY.match(key)
    return match.group("source") if match else None


def is_turn_scoped(artifact: Artifact) -> bool:
    """Tool results, retrieval chunks and recalled blocks live for one turn: never promoted
    into L2."""
    return (
        artifact.source_type in (TOOL_SOURCE, RECALL_SOURCE)
        or chunk_source(artifact.key) is not None
    )


@attrs.frozen
class ToolResult:
    """What one tool call returned; ``args`` is canonical JSON (part of the identity)."""

    name: str
    args: str
    result: str

    @property
    def title(self) -> str:
        return self.name

    @property
    def locator(self) -> str:
        """The call itself: re-running it gets the result again."""
        return f"{self.name}({self.args})"

    def body(self) -> str:
        return self.result

    def attributes(self) -> tuple[tuple[str, str], ...]:
        return (("name", self.name), ("args", self.args))

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        return attrs.evolve(self, result=fn(self.result))


@attrs.frozen
class Chunk:
    """A retrieval hit: lines ``start``-``end`` of the artifact keyed ``source``."""

    source: str
    start: int
    end: int
    text: str
    source_title: str = ""

    @property
    def title(self) -> str:
        name = self.source_title or self.source.split(":", 1)[1]
        return f"{name} (lines {self.start}-{self.end})"

    @property
    def locator(self) -> str:
        return chunk_key(self.source, self.start, self.end)

    def body(self) -> str:
        return self.text

    def attributes(self) -> tuple[tuple[str, str], ...]:
        return (("chunk_of", self.source), ("lines", f"{self.start}-{self.end}"))

    def replace_text(self, fn: Callable[[str], str]) -> Self:
        return attrs.evolve(self, text=fn(self.text))


def tool_artifact(
    name: str, args: Mapping[str, Any] | str, result: str, *, recoverable: bool = True
) -> Artifact:
    """A tool result as an artifact; recoverable (it can be re-run) unless the host says no."""
    if not name or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise AttachmentError(f"tool {name!r}", "a tool name is letters, digits, _ . - only")
    payload = ToolResult(name, canonical_args(args), result)
    return make_artifact(TOOL_SOURCE, tool_key(name, args), payload, recoverable=recoverable)


def chunk_artifact(source: str, start: int, end: int, text: str, title: str = "") -> Artifact:
    """A retrieval chunk keyed ``<source>#L<start>-<end>``, typed like its source."""
    if ":" not in source or "#" in source:
        raise AttachmentError(f"hit {source!r}", "source must be an artifact key like note:a.md")
    if not 1 <= start <= end:
        raise AttachmentError(f"hit {source}", f"line range {start}-{end} is not 1 <= start <= end")
    source_type = source.split(":", 1)[0]
    payload = Chunk(source, start, end, text, title)
    return make_artifact(source_type, chunk_key(source, start, end), payload, recoverable=True)


@attrs.frozen
class Hit:
    """One retrieval hit as the host (or a script) gives it."""

    source: str
    start: int
    end: int
    text: str
    title: str = ""

    def artifact(self) -> Artifact:
        return chunk_artifact(self.source, self.start, self.end, self.text, self.title)


def hit(source: str, lines: tuple[int, int] | Sequence[int], text: str, title: str = "") -> Hit:
    """A retrieval hit: ``hit("note:docs/a.md", (10, 40), text)``."""
    start, end = (int(x) for x in lines)
    return Hit(source, start, end, text, title)


@attrs.frozen
class Hits:
    """Retrieval hits attached to a turn (question answering over search results)."""

    items: tuple[Hit, ...]
    kind: str = attrs.field(default="hits", init=False)

    def describe(self) -> str:
        return f"hits ({len(self.items)})"

    def processed(self) -> Processed:
        return Processed(tuple(h.artifact() for h in self.items))


def hits(items: Iterable[Hit]) -> Hits:
    return Hits(tuple(items))


@attrs.frozen
class ToolUse:
    """A single-shot tool call and its result; ``hits`` are the chunks a search returned."""

    name: str
    args: str
    result: str
    hits: tuple[Hit, ...] = ()
    recoverable: bool = True
    kind: str = attrs.field(default="tool", init=False)

    def describe(self) -> str:
        return f"tool {self.name}({self.args})"

    def processed(self) -> Processed:
        result = self.result
        if self.hits and not result:
            keys = ", ".join(chunk_key(h.source, h.start, h.end) for h in self.hits)
            result = f"{len(self.hits)} passage(s) found: {keys}"
        main = tool_artifact(self.name, self.args, result, recoverable=self.recoverable)
        return Processed((main, *(h.artifact() for h in self.hits)))


def tool(
    name: str,
    args: Mapping[str, Any] | str | None = None,
    result: str = "",
    *,
    hits: Iterable[Hit] = (),
    recoverable: bool = True,
) -> ToolUse:
    """A single-shot tool result to attach: ``tool("search", {"q": "sync"}, "...")``."""
    tool_artifact(name, args or {}, result)  # validates name and args early
    return ToolUse(name, canonical_args(args or {}), result, tuple(hits), recoverable)


def _parse_hit(raw: Any, where: str) -> Hit:
    if not isinstance(raw, Mapping):
        raise AttachmentError(
            where, 'a hit is {"source": "note:a.md", "lines": [1, 9], "text": ...}'
        )
    lines = raw.get("lines")
    if (
        not isinstance(lines, Sequence)
        or isinstance(lines, str)
        or len(lines) != 2
        or not all(isinstance(x, int) for x in lines)
    ):
        raise AttachmentError(where, "lines must be [start, end]")
    source, text = raw.get("source"), raw.get("text")
    if not isinstance(source, str) or not isinstance(text, str):
        raise AttachmentError(where, "source and text must be strings")
    title = raw.get("title", "")
    return hit(source, tuple(lines), text, title if isinstance(title, str) else "")


def parse_tool(data: Mapping[str, Any]) -> ToolUse:
    """The script form ``{"tool": name, "args": {...}, "result": str, "hits": [...]}``."""
    name = data.get("tool", data.get("name"))
    if not isinstance(name, str):
        raise AttachmentError("tool", "needs a string name")
    args = data.get("args", {})
    if not isinstance(args, Mapping):
        raise AttachmentError(f"tool {name}", "args must be a mapping")
    result = data.get("result", "")
    if not isinstance(result, str):
        raise AttachmentError(f"tool {name}", "result must be a string")
    raw_hits = data.get("hits", [])
    if not isinstance(raw_hits, list):
        raise AttachmentError(f"tool {name}", "hits must be a list")
    found = [_parse_hit(h, f"tool {name} hit {i}") for i, h in enumerate(raw_hits)]
    recoverable = data.get("recoverable", True)
    return tool(name, args, result, hits=found, recoverable=bool(recoverable))


def parse_hits(data: Mapping[str, Any]) -> Hits:
    raw = data.get("hits")
    if not isinstance(raw, list):
        raise AttachmentError("hits", "must be a list of hits")
    return hits(_parse_hit(h, f"hit {i}") for i, h in enumerate(raw))


@attrs.frozen
class ToolSources:
    """A source resolver that also understands tool results and hits (no I/O for them)."""

    inner: SourceResolver

    def process(self, spec: AttachmentSpec) -> Processed:
        if isinstance(spec, ToolUse | Hits):
            return spec.processed()
        return self.inner.process(spec)

    def parse(self, data: Mapping[str, Any]) -> AttachmentSpec:
        if "tool" in data:
            return parse_tool(data)
        if "hits" in data and len(data) == 1:
            return parse_hits(data)
        return self.inner.parse(data)

    def with_changes(self, changes: Mapping[str, str]) -> ToolSources:
        return ToolSources(self.inner.with_changes(changes))

    @property
    def kinds(self) -> AttachmentKinds:
        return self.inner.kinds

    def for_turn(self) -> ToolSources:
        return ToolSources(resolver_for_turn(self.inner))
