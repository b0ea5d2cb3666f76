"""Token counts: encodings, the counter, model profiles, a request's exact count, and the
usage a provider reports back (with the calibration learned from it)."""

from lamina.pipeline._conversation.usage import (
    CALIBRATION_WINDOW,
    MARGIN_BOUNDS,
    Calibration,
    TurnUsage,
    Usage,
    read_usage,
)
from lamina.pipeline._tokens.counter import (
    TOKENIZERS,
    CountMemo,
    TokenCounter,
    encoded_length,
    get_encoding,
)
from lamina.pipeline._tokens.profiles import (
    PROFILES,
    ModelProfile,
    Provider,
    generic_profile,
    get_profile,
    provider_of,
)
from lamina.pipeline._turn.measure import MESSAGE_OVERHEAD, REPLY_PRIMING, request_tokens

__all__ = [
    "CALIBRATION_WINDOW",
    "MARGIN_BOUNDS",
    "MESSAGE_OVERHEAD",
    "PROFILES",
    "REPLY_PRIMING",
    "TOKENIZERS",
    "Calibration",
    "CountMemo",
    "ModelProfile",
    "Provider",
    "TokenCounter",
    "TurnUsage",
    "Usage",
    "encoded_length",
    "generic_profile",
    "get_encoding",
    "get_profile",
    "provider_of",
    "read_usage",
    "request_tokens",
]
