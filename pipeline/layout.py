"""What a request renderer needs to lay out the messages of a turn as the core measures them:
the one join and order of blocks, the system message's parts, the user message of a turn
whose context stays where it was first sent, the labels they use, the deferred library's
state, and where a prefix of a request's text can be counted. Lamina's own renderers use
it; a host that only builds turns never needs it."""

from lamina.pipeline._conversation.batch import (
    APPEND_REFERENCES_INTRO,
    RESTORED_INTRO,
    BatchState,
    append_parts,
    segment_reference,
)
from lamina.pipeline._model.envelope import (
    LIBRARY_HEADING,
    NOT_SENT_INTRO,
    QUERY_LABEL,
    REFERENCES_INTRO,
    Batch,
    arrange_user,
    join_blocks,
    system_parts,
)
from lamina.pipeline._model.recall import RECALL_SOURCE
from lamina.pipeline._tokens.counter import next_piece_start

__all__ = [
    "APPEND_REFERENCES_INTRO",
    "LIBRARY_HEADING",
    "NOT_SENT_INTRO",
    "QUERY_LABEL",
    "RECALL_SOURCE",
    "REFERENCES_INTRO",
    "RESTORED_INTRO",
    "Batch",
    "BatchState",
    "append_parts",
    "arrange_user",
    "join_blocks",
    "next_piece_start",
    "segment_reference",
    "system_parts",
]
