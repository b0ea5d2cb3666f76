"""Lamina's application layer: replaying recorded conversations under policy configs."""

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
    "SummarizerConfig",
    "find_corpus",
    "load_config",
    "make_engine",
    "parse_config",
    "replay",
    "replay_recording",
    "replay_script",
    "summarize",
]
