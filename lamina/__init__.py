"""Lamina's application layer: replaying recorded conversations under policy configs, and
the HTTP server (``lamina serve``) for hosts in any language."""

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
from lamina._engines import DaskEngine, Engine, LocalEngine, SerialEngine, make_engine
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
from lamina._summary import ConfigSummary, ProviderSummary, RunSummary, summarize

__all__ = [
    "BudgetConfig",
    "ConfigSummary",
    "ConversationHub",
    "Corpus",
    "DaskEngine",
    "Engine",
    "InvariantFailure",
    "LocalEngine",
    "ProviderPricing",
    "ProviderResult",
    "ProviderSummary",
    "Recording",
    "ReplayConfig",
    "ReplayError",
    "ReplayResult",
    "ReplayRun",
    "RunSummary",
    "SerialEngine",
    "ServerConfig",
    "SummarizerConfig",
    "create_app",
    "find_corpus",
    "is_loopback",
    "load_config",
    "make_engine",
    "parse_config",
    "read_token",
    "replay",
    "replay_recording",
    "replay_script",
    "serve",
    "summarize",
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
