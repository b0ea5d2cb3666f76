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

from lamina.pipeline._errors import (
    ArgumentError,
    AttachmentError,
    BudgetExceeded,
    ChatTranscriptError,
    ConfigError,
    ConflictError,
    ConversationError,
    FetchError,
    InvariantViolation,
    LaminaError,
    NoteNotFound,
    NotRebuilt,
    PathOutsideVault,
    PdfError,
    PipelineError,
    PluginError,
    RegistryError,
    ScriptError,
    StageError,
    StoreCorrupt,
    StoreError,
    StoreForeignTable,
    StoreLocked,
    StoreNeedsMigration,
    StoreSchemaTooNew,
    StoreUnknownFields,
    StoreUnreachable,
    TokenizerUnavailable,
    TranscriptError,
    UnknownAttachmentKind,
    UnknownConversation,
    UnknownSetting,
)

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
