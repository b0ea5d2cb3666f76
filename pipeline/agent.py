"""Agent loops: the steps a model takes inside one turn (calls, tool results), their requests
and exact counts."""

from lamina.pipeline._conversation.agent import (
    CALL_OVERHEAD,
    QUESTION_AGAIN,
    AgentCall,
    AgentStep,
    AgentTurn,
    Loop,
    LoopCall,
    LoopStep,
    agent_call,
    loop_tokens,
)

__all__ = [
    "CALL_OVERHEAD",
    "QUESTION_AGAIN",
    "AgentCall",
    "AgentStep",
    "AgentTurn",
    "Loop",
    "LoopCall",
    "LoopStep",
    "agent_call",
    "loop_tokens",
]
