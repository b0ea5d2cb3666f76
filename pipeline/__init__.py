"""Lamina's core: typed artifacts, the turn graph, stages, layers and the envelope.

The top level holds what a host uses to build turns: the conversation and its settings,
the envelope and its layers, the budget and its report, the protocols a host implements
(``Stage``, ``Retriever``, ``Summarizer``, ``SourceResolver``, ``SegmentRenderer``,
``CacheMeter``), the invariant checker and the base error. The rest sits in namespaces,
each with ``__all__``:

- ``lamina.pipeline.errors``: the error tree under ``LaminaError``
- ``lamina.pipeline.store``: stores, saved turns, stateless turns, chat transcripts
- ``lamina.pipeline.tokens``: encodings, the counter, model profiles, provider usage
- ``lamina.pipeline.text``: hashes, markdown sections, block markup and escaping
- ``lamina.pipeline.inputs``: confined file reads, bounded YAML and JSON
- ``lamina.pipeline.tools``: tool results and retrieval hits for one turn
- ``lamina.pipeline.agent``: agent loops inside a turn
- ``lamina.pipeline.views``: an artifact's forms, summarizers and the summary memo
- ``lamina.pipeline.stages``: the built-in stages and what a stage works with
- ``lamina.pipeline.recall``: recalled history and its rankers
- ``lamina.pipeline.sources``: what a source of artifacts returns
- ``lamina.pipeline.layout``: what a request renderer needs to lay out the messages"""

from lamina.pipeline import agent as agent
from lamina.pipeline import errors as errors
from lamina.pipeline import inputs as inputs
from lamina.pipeline import layout as layout
from lamina.pipeline import recall as recall
from lamina.pipeline import sources as sources
from lamina.pipeline import stages as stages
from lamina.pipeline import store as store
from lamina.pipeline import text as text
from lamina.pipeline import tokens as tokens
from lamina.pipeline import tools as tools
from lamina.pipeline import views as views
from lamina.pipeline._conversation.conversation import (
    CacheMeter,
    Conversation,
    ConversationState,
)
from lamina.pipeline._conversation.invariants import check_envelope
from lamina.pipeline._errors import LaminaError
from lamina.pipeline._model.artifacts import Artifact, AttachmentSpec, SourceResolver
from lamina.pipeline._model.envelope import (
    BudgetReport,
    BuildReport,
    CachedPrefix,
    Decision,
    DecisionAction,
    DecisionForm,
    DecisionLayer,
    Envelope,
    Form,
    Layer,
    LayerName,
    Segment,
    View,
)
from lamina.pipeline._model.history import HistoryEntry
from lamina.pipeline._model.library import Library, LibraryEntry
from lamina.pipeline._model.recall import Retriever
from lamina.pipeline._stages.builtin import Pipeline, Stage
from lamina.pipeline._turn.budget import Budget, BudgetSettings
from lamina.pipeline._turn.graph import HistoryView, SystemPrompt, TurnGraph
from lamina.pipeline._views.summarize import Summarizer
from lamina.pipeline._views.views import Policy, SegmentRenderer

__all__ = [
    "Artifact",
    "AttachmentSpec",
    "Budget",
    "BudgetReport",
    "BudgetSettings",
    "BuildReport",
    "CacheMeter",
    "CachedPrefix",
    "Conversation",
    "ConversationState",
    "Decision",
    "DecisionAction",
    "DecisionForm",
    "DecisionLayer",
    "Envelope",
    "Form",
    "HistoryEntry",
    "HistoryView",
    "LaminaError",
    "Layer",
    "LayerName",
    "Library",
    "LibraryEntry",
    "Pipeline",
    "Policy",
    "Retriever",
    "Segment",
    "SegmentRenderer",
    "SourceResolver",
    "Stage",
    "Summarizer",
    "SystemPrompt",
    "TurnGraph",
    "View",
    "check_envelope",
]
