"""What a source of artifacts returns and names: processed artifacts, links, payloads,
warnings, the kinds of attachment, and the empty source and renderer a bare core uses."""

from lamina.pipeline._conversation.conversation import NoRenderer, NoSources
from lamina.pipeline._model.artifacts import (
    Link,
    Payload,
    Processed,
    TurnWarning,
    make_artifact,
    resolver_for_turn,
)
from lamina.pipeline._model.kinds import AttachmentKinds, LabelLookup, NoKinds

__all__ = [
    "AttachmentKinds",
    "LabelLookup",
    "Link",
    "NoKinds",
    "NoRenderer",
    "NoSources",
    "Payload",
    "Processed",
    "TurnWarning",
    "make_artifact",
    "resolver_for_turn",
]
