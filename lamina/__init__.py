"""Lamina for host apps: one import for a conversation, its attachments, requests and store.

The layers underneath import one way: ``lamina.processors`` (sources -> artifacts) and
``lamina.renderers`` (layers -> text and provider requests) build on ``lamina.pipeline``
(the core); the rest of this package wires them together (facade, CLI, scripts, replay,
server) and imports all three.
"""

import typing

from lamina._config import (
    BudgetConfig,
    ProviderPricing,
    ReplayConfig,
    SummarizerConfig,
    load_config,
    parse_config,
)
from lamina._corpus import Corpus, Recording, find_corpus
from lamina._engines import (
    DaskEngine,
    Engine,
    EngineError,
    LocalEngine,
    SerialEngine,
    make_engine,
)
from lamina._host import (
    Conversation,
    default_sources,
    export_transcript,
    import_transcript,
    load_conversation,
    parse_transcript,
    rebuild_envelope,
    rebuild_envelopes,
    render_transcript,
    renderer_for,
    stateless_turn,
)
from lamina._replay import (
    InvariantFailure,
    ProviderResult,
    ReplayError,
    ReplayResult,
    ReplayRun,
    replay,
    replay_recording,
    replay_script,
)
from lamina._script import Script, ScriptTurn, load_script, parse_script, run_saved, run_script
from lamina._summary import ConfigSummary, ProviderSummary, RunSummary, summarize
from lamina.pipeline import Budget, Envelope, LaminaError, Policy, SystemPrompt, check_envelope
from lamina.pipeline.errors import AttachmentError, BudgetExceeded, ConfigError, ConflictError
from lamina.pipeline.store import PostgresStore, SqliteStore, open_store, save_turn
from lamina.pipeline.tools import tool
from lamina.processors import (
    Registry,
    Sources,
    Vault,
    folder,
    note,
    pdf,
    selection,
    tag,
    url,
    youtube,
)
from lamina.renderers import openai_messages, render_report, render_request, trace_document

__all__ = [
    "AttachmentError",
    "Budget",
    "BudgetConfig",
    "BudgetExceeded",
    "ConfigError",
    "ConfigSummary",
    "ConflictError",
    "Conversation",
    "ConversationHub",
    "Corpus",
    "DaskEngine",
    "Engine",
    "EngineError",
    "Envelope",
    "InvariantFailure",
    "LaminaError",
    "LocalEngine",
    "Policy",
    "PostgresStore",
    "ProviderPricing",
    "ProviderResult",
    "ProviderSummary",
    "Recording",
    "Registry",
    "ReplayConfig",
    "ReplayError",
    "ReplayResult",
    "ReplayRun",
    "RunSummary",
    "Script",
    "ScriptTurn",
    "SerialEngine",
    "ServerConfig",
    "Sources",
    "SqliteStore",
    "SummarizerConfig",
    "SystemPrompt",
    "Vault",
    "check_envelope",
    "create_app",
    "default_sources",
    "export_transcript",
    "find_corpus",
    "folder",
    "import_transcript",
    "is_loopback",
    "load_config",
    "load_conversation",
    "load_script",
    "make_engine",
    "note",
    "open_store",
    "openai_messages",
    "parse_config",
    "parse_script",
    "parse_transcript",
    "pdf",
    "read_token",
    "rebuild_envelope",
    "rebuild_envelopes",
    "render_report",
    "render_request",
    "render_transcript",
    "renderer_for",
    "replay",
    "replay_recording",
    "replay_script",
    "run_saved",
    "run_script",
    "save_turn",
    "selection",
    "serve",
    "stateless_turn",
    "summarize",
    "tag",
    "tool",
    "trace_document",
    "url",
    "youtube",
]

# The server's names need the `server` extra (FastAPI, uvicorn): imported on first use.
_SERVER = {
    "ConversationHub": "lamina._hub",
    "ServerConfig": "lamina._hub",
    "create_app": "lamina._server",
    "is_loopback": "lamina._server",
    "read_token": "lamina._server",
    "serve": "lamina._server",
}

if typing.TYPE_CHECKING:
    from lamina._hub import ConversationHub, ServerConfig
    from lamina._server import create_app, is_loopback, read_token, serve


def __getattr__(name: str) -> typing.Any:
    if name in _SERVER:
        import importlib

        return getattr(importlib.import_module(_SERVER[name]), name)
    raise AttributeError(f"module 'lamina' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SERVER})
