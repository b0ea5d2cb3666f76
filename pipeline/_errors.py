"""Lamina's one error tree; every error names the input it is about.

LaminaError
├── ConfigError            bad settings, policies or profiles (.setting)
│   └── TokenizerUnavailable  an open model's tokenizer extra is not installed (.tokenizer, .extra)
├── ArgumentError          an API call got an argument of the wrong type or value (.argument)
├── PipelineError          stage wiring refused at build time (.stage)
├── StageError             a stage failed while running (.stage)
├── RegistryError          processor / renderer registration (.kind)
│   └── PluginError        a plugin failed to load (.plugin)
├── AttachmentError        an attachment could not be turned into artifacts (.spec)
│   ├── UnknownAttachmentKind (.kind, .known)
│   ├── PathOutsideVault      (.path)
│   ├── NoteNotFound          (.path, .suggestions)
│   ├── FetchError            (.url, .reason)  web pages
│   ├── TranscriptError       (.video)        YouTube
│   └── PdfError              (.path, .reason)
├── ConversationError      a conversation method was called out of order
├── ScriptError            a conversation script is malformed (.path, .where)
├── InvariantViolation     an envelope broke an invariant (.invariant, .key)
├── StoreError             a conversation store file cannot be used (.path)
│   ├── StoreLocked           another process holds the write lock too long
│   ├── StoreCorrupt          not a Lamina store, or its bytes are damaged
│   │   └── StoreForeignTable another application's table in Lamina's place (.table)
│   ├── StoreSchemaTooNew     written by a newer Lamina (.found, .supported, .turn)
│   │   └── StoreUnknownFields a record holds fields this Lamina lacks (.fields)
│   ├── StoreNeedsMigration   too old to read without migrating (.found, .supported)
│   ├── StoreUnreachable      the database server cannot be reached (.reason)
│   ├── ConflictError         the conversation moved on since this save's parent
│   │                         (.conversation_id, .head_turn, .head_hash)
│   └── UnknownConversation   no conversation with that id (.conversation_id)
├── ChatTranscriptError    a markdown chat transcript cannot be read (.path, .line)
└── BudgetExceeded         the payload cannot fit the window (.report)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ArgumentError",
    "AttachmentError",
    "BudgetExceeded",
    "ChatTranscriptError",
    "ConfigError",
    "ConflictError",
    "ConversationError",
    "FetchError",
    "InvariantViolation",
    "LaminaError",
    "NotRebuilt",
    "NoteNotFound",
    "PathOutsideVault",
    "PdfError",
    "PipelineError",
    "PluginError",
    "RegistryError",
    "ScriptError",
    "StageError",
    "StoreCorrupt",
    "StoreError",
    "StoreForeignTable",
    "StoreLocked",
    "StoreNeedsMigration",
    "StoreSchemaTooNew",
    "StoreUnknownFields",
    "StoreUnreachable",
    "TokenizerUnavailable",
    "TranscriptError",
    "UnknownAttachmentKind",
    "UnknownConversation",
    "UnknownSetting",
]


class LaminaError(Exception):
    """Root of every error Lamina raises on purpose."""


class ConfigError(LaminaError):
    """A setting, policy or profile value is invalid."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        super().__init__(f"{setting}: {problem}")


class UnknownSetting(ConfigError):
    """A processor setting nobody declares (a misspelt key, or a kind with no settings)."""

    def __init__(self, setting: str, kind: str, known: Sequence[str]) -> None:
        self.setting, self.kind, self.known = setting, kind, tuple(known)
        listed = ", ".join(self.known) if self.known else "none"
        owner = f"the {kind!r} processor has no such setting" if kind else "no processor has it"
        super().__init__(setting, f"unknown setting: {owner} (known: {listed})")


class TokenizerUnavailable(ConfigError):
    """A tokenizer whose files come from an optional extra that is not installed."""

    def __init__(self, tokenizer: str, extra: str, package: str) -> None:
        self.tokenizer = tokenizer
        self.extra = extra
        self.package = package
        super().__init__(
            "tokenizer",
            f"{tokenizer!r} needs the {package!r} package: pip install 'lamina[{extra}]'",
        )


class ArgumentError(LaminaError, ValueError):
    """A public function or method got an argument of the wrong type or value (also a
    ``ValueError``, so a host's ``except ValueError`` written before it keeps working)."""

    def __init__(self, argument: str, problem: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {problem}")


class PipelineError(LaminaError):
    """The stage graph is invalid (unknown dependency, cycle, duplicate name)."""

    def __init__(self, stage: str, problem: str) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r}: {problem}")


class StageError(LaminaError):
    """A stage raised while building a turn."""

    def __init__(self, stage: str, problem: str) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r} failed: {problem}")


class RegistryError(LaminaError):
    """A processor or renderer could not be registered or found."""

    def __init__(self, kind: str, problem: str) -> None:
        self.kind = kind
        super().__init__(f"{kind!r}: {problem}")


class PluginError(RegistryError):
    """An installed plugin failed to load; the others still load."""

    def __init__(self, plugin: str, problem: str) -> None:
        self.plugin = plugin
        super().__init__(plugin, f"plugin failed to load: {problem}")


class AttachmentError(LaminaError):
    """An attachment could not be turned into artifacts."""

    def __init__(self, spec: str, problem: str) -> None:
        self.spec = spec
        super().__init__(f"{spec}: {problem}")


class UnknownAttachmentKind(AttachmentError):
    """No processor is registered for an attachment kind."""

    def __init__(self, kind: str, known: Sequence[str]) -> None:
        self.kind = kind
        self.known = tuple(sorted(known))
        super().__init__(kind, f"unknown attachment kind (known: {', '.join(self.known)})")


class NotRebuilt(AttachmentError):
    """An attachment a transcript names could not be rebuilt from its label (and why)."""

    def __init__(self, kind: str, label: str, reason: str) -> None:
        self.kind, self.label, self.reason = kind, label, reason
        super().__init__(f"{kind} {label}", reason)


class PathOutsideVault(AttachmentError):
    """A path escapes the vault (``..``, absolute, or a symlink out of it)."""

    def __init__(self, path: str, problem: str = "path escapes the vault") -> None:
        self.path = path
        super().__init__(path, problem)


class NoteNotFound(AttachmentError):
    """A note does not exist; carries close matches to suggest."""

    def __init__(self, path: str, suggestions: Sequence[str] = (), vault: str = "") -> None:
        self.path = path
        self.suggestions = tuple(suggestions)
        self.vault = vault
        hint = f" (did you mean: {', '.join(self.suggestions)}?)" if self.suggestions else ""
        where = f" {vault}" if vault else ""
        super().__init__(path, f"no such note in the vault{where}{hint}")


class FetchError(AttachmentError):
    """A web page could not be fetched; ``reason`` is a short machine-readable word."""

    def __init__(self, url: str, reason: str, detail: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(url, f"{reason}: {detail}")


class TranscriptError(AttachmentError):
    """A YouTube reference or transcript file is invalid."""

    def __init__(self, video: str, problem: str) -> None:
        self.video = video
        super().__init__(video, problem)


class PdfError(AttachmentError):
    """A PDF could not be read; ``reason`` is encrypted, corrupt, pages, ..."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(path, f"{reason}: {detail}")


class ConversationError(LaminaError):
    """A conversation method was called out of order (e.g. reply() before turn())."""


class ScriptError(LaminaError):
    """A conversation script is malformed; ``where`` points into it."""

    def __init__(self, path: str, where: str, problem: str) -> None:
        self.path = path
        self.where = where
        loc = f" at {where}" if where else ""
        super().__init__(f"{path}{loc}: {problem}")


class InvariantViolation(LaminaError):
    """An envelope broke one of the invariants (docs/ARCHITECTURE.md, "Invariants")."""

    def __init__(self, invariant: int, problem: str, key: str | None = None) -> None:
        self.invariant = invariant
        self.key = key
        super().__init__(f"invariant {invariant} violated: {problem}")


class BudgetExceeded(LaminaError):
    """Even the most aggressive cuts cannot fit the payload; carries the report."""

    def __init__(self, problem: str, report: Any = None) -> None:
        self.report = report
        super().__init__(problem)


class StoreError(LaminaError):
    """A conversation store cannot be opened, read or written; names the file."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"store {path}: {problem}")


class StoreLocked(StoreError):
    """Another process held the store's write lock longer than the timeout."""


class StoreCorrupt(StoreError):
    """The file is not a Lamina store, or a stored record fails its hash check."""


class StoreForeignTable(StoreCorrupt):
    """A table where Lamina keeps one holds another application's columns (``.table``):
    the store is refused before any migration alters it."""

    def __init__(self, path: str, table: str, problem: str) -> None:
        self.table = table
        super().__init__(path, problem)


class StoreSchemaTooNew(StoreError):
    """The store, or one turn in it, was written by a newer Lamina whose schema this
    version cannot read (``.found``, ``.supported``). A turn's own version is checked on
    every read (``.conversation_id``, ``.turn``), so a process that opened the store before
    a newer one migrated it refuses that newer one's turns instead of misreading them."""

    def __init__(
        self,
        path: str,
        found: int,
        supported: int,
        conversation_id: str | None = None,
        turn: int | None = None,
    ) -> None:
        self.found = found
        self.supported = supported
        self.conversation_id = conversation_id
        self.turn = turn
        where = "" if conversation_id is None else f"conversation {conversation_id!r} turn {turn}: "
        super().__init__(
            path,
            f"{where}schema version {found} is newer than this Lamina supports ({supported}); "
            "upgrade Lamina",
        )


class StoreUnknownFields(StoreSchemaTooNew):
    """A stored record holds fields this Lamina's types lack (``.fields``, e.g.
    ``BatchState.restored``): a newer Lamina wrote it, and reading on would drop them."""

    def __init__(
        self,
        path: str,
        fields: Sequence[str],
        found: int,
        supported: int,
        conversation_id: str | None = None,
        turn: int | None = None,
    ) -> None:
        self.fields = tuple(fields)
        self.found = found
        self.supported = supported
        self.conversation_id = conversation_id
        self.turn = turn
        where = "" if conversation_id is None else f"conversation {conversation_id!r} turn {turn} "
        StoreError.__init__(  # its own message, not the version sentence
            self,
            path,
            f"{where}holds fields this Lamina does not know ({', '.join(self.fields)}): "
            "a newer Lamina wrote it and reading on would drop them; upgrade Lamina",
        )


class StoreNeedsMigration(StoreError):
    """A read-only open met a store whose schema is older than this Lamina reads without
    migrating it; nothing was changed. ``lamina migrate STORE`` (or any open for writing)
    migrates it."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            path,
            f"schema version {found} must be migrated to {supported} before it can be read, "
            f"which a read-only open never does: run `lamina migrate {path}` first",
        )


class StoreUnreachable(StoreError):
    """The database server refused or did not answer (down, wrong address or password)."""

    def __init__(self, path: str, reason: str) -> None:
        self.reason = reason
        super().__init__(path, f"cannot reach the database server: {reason}")


class ConflictError(StoreError):
    """A save named a parent that is no longer the conversation's head; nothing was written.

    Carries the head as stored now (``head_turn``, ``head_hash``) and the one the save
    expected, so a host can reload and retry."""

    def __init__(
        self,
        path: str,
        conversation_id: str,
        head_turn: int,
        head_hash: str,
        expected_turn: int,
        expected_hash: str,
    ) -> None:
        self.conversation_id = conversation_id
        self.head_turn = head_turn
        self.head_hash = head_hash
        self.expected_turn = expected_turn
        self.expected_hash = expected_hash
        super().__init__(
            path,
            f"conversation {conversation_id!r} moved on: its head is turn {head_turn} "
            f"({head_hash[:16] or 'empty'}), this save continues turn {expected_turn} "
            f"({expected_hash[:16] or 'empty'}); nothing was saved, load it again",
        )


class UnknownConversation(StoreError):
    """No conversation with this id is in the store."""

    def __init__(self, path: str, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(path, f"no conversation {conversation_id!r}")


class ChatTranscriptError(LaminaError):
    """A markdown chat transcript is malformed; ``line`` is 1-based (0 when unknown)."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        loc = f":{line}" if line else ""
        super().__init__(f"{path}{loc}: {problem}")
