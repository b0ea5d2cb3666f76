"""Turn-scoped content a host passes in: tool results and retrieval hits, their keys and specs."""

from lamina.pipeline._conversation.agent import tool_turn
from lamina.pipeline._model.tools import (
    TOOL_SOURCE,
    Chunk,
    Hit,
    Hits,
    ToolResult,
    ToolSources,
    ToolUse,
    chunk_artifact,
    chunk_key,
    chunk_source,
    hit,
    hits,
    is_turn_scoped,
    tool,
    tool_artifact,
    tool_key,
)

__all__ = [
    "TOOL_SOURCE",
    "Chunk",
    "Hit",
    "Hits",
    "ToolResult",
    "ToolSources",
    "ToolUse",
    "chunk_artifact",
    "chunk_key",
    "chunk_source",
    "hit",
    "hits",
    "is_turn_scoped",
    "tool",
    "tool_artifact",
    "tool_key",
    "tool_turn",
]
