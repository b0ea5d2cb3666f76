"""The HTTP API's request and response bodies (pydantic): they are the OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool

from lamina._budgets import OBJECTIVE_FIELDS
from lamina.pipeline.inputs import LoadLimits

__all__ = [
    "ConversationCreate",
    "ConversationOut",
    "ConversationsOut",
    "ErrorOut",
    "HeadOut",
    "LayerOut",
    "MessageOut",
    "NoteIn",
    "PolicyIn",
    "ReplyIn",
    "ReplyOut",
    "SegmentOut",
    "SystemIn",
    "ToolCallIn",
    "TranscriptOut",
    "TurnIn",
    "TurnOut",
]

Provider = Literal["openai", "openai-responses", "anthropic", "gemini"]
LayoutName = Literal["default", "append-only", "naive"]


_MAX_DEPTH = LoadLimits().max_depth


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it nests at most as deep as Lamina loads JSON anywhere (64 levels),
    walked without recursion: deeper, it is refused here, naming its field, on the
    HotLane and FastAPI's route alike, before any recursive code meets it."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return value


# A JSON object a request carries through as it is (an attachment form, tool arguments).
Shallow = Annotated[dict[str, Any], AfterValidator(_shallow)]


class _In(BaseModel):
    """Request bodies refuse unknown fields: a misspelt field is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class SystemIn(_In):
    stable: str = ""
    mutable: str = ""


class PolicyIn(_In):
    freshness: Literal["pin", "refresh"] = "pin"
    reattach: Literal["full", "reference"] = "full"


class HeadOut(BaseModel):
    """Where a conversation stands: its last saved turn and that state's hash."""

    turn: int = Field(ge=0)
    hash: str


class HeadIn(_In):
    """The head a request continues (If-Match): a stale one is answered with 409."""

    turn: int = Field(ge=0)
    hash: str = Field(max_length=128)


class ConversationCreate(_In):
    system: str | SystemIn = ""
    window: int | None = Field(default=None, ge=1, description="Context window: a budget.")
    reserve: int | None = Field(default=None, ge=0, description="Tokens kept for the reply.")
    model: str | None = Field(default=None, description="Model profile for the budget.")
    recall: bool | None = Field(
        default=None,
        description="Whether earlier messages the suffix of history does not show are "
        "findable, sent when the query matches them (needs a window or a model; on by "
        "default with a budget).",
    )
    objective: dict[str, Any] | None = Field(
        default=None,
        description="The budget objective's settings to set (needs a window or a model), "
        "the others keep their defaults: " + ", ".join(OBJECTIVE_FIELDS) + " (docs/BUDGET.md).",
    )
    tokenizer: str = Field(
        default="",
        max_length=64,
        description="Tokenizer name; empty: the model's (with model), else o200k_base.",
    )
    policy: PolicyIn = Field(default_factory=PolicyIn)
    provider: Provider | None = Field(
        default=None, description="Render each turn's provider request with this renderer."
    )
    layout: LayoutName = "default"
    defer_library: StrictBool = Field(
        default=True,
        description="Defer the library's growth to the next prefix break: each turn's "
        "context stays in the user message that sent it until then (false: the library "
        "layout, each turn's context enters the system message the turn after).",
    )
    vault: bool = Field(default=True, description="Read notes from the server's --vault.")
    title: str = Field(default="", max_length=200)


class NoteIn(_In):
    """A note from the client's files: treated exactly as the vault note at ``path``."""

    path: str = Field(min_length=1, max_length=1024)
    content: str
    mtime: float | None = Field(default=None, description="Accepted; content alone decides.")


class ToolCallIn(_In):
    name: str = Field(min_length=1, max_length=200)
    args: Shallow = Field(default_factory=dict)
    result: str = ""


class TurnIn(_In):
    parent: HeadIn
    user: str
    attach: list[Shallow] = Field(
        default_factory=list, description='Script forms, e.g. {"note": "a.md"}.'
    )
    tools: list[ToolCallIn] = Field(default_factory=list)
    vault_changes: dict[str, str] = Field(default_factory=dict)
    notes: list[NoteIn] = Field(default_factory=list)


class ReplyIn(_In):
    parent: HeadIn
    text: str


class SegmentOut(BaseModel):
    key: str
    source_type: str
    form: str
    content_hash: str
    tokens: int


class LayerOut(BaseModel):
    hash: str
    tokens: int
    segments: list[SegmentOut]


class MessageOut(BaseModel):
    role: str
    content: str


class TurnOut(BaseModel):
    """A built turn: the trace turn of ``lamina run --json`` plus the new head."""

    conversation_id: str
    head: HeadOut
    turn: int
    prefix_hash: str
    tokens_total: int
    layers: dict[str, LayerOut]
    messages: list[MessageOut]
    stats: dict[str, Any]
    warnings: list[dict[str, str]]
    cache: dict[str, Any]
    budget: dict[str, Any] | None = None
    request: dict[str, Any] | None = None


class ReplyOut(BaseModel):
    conversation_id: str
    head: HeadOut


class ConversationOut(BaseModel):
    id: str
    created: str
    title: str
    model: str
    head: HeadOut
    provider: str | None
    layout: str
    defer_library: bool
    vault: bool


class ConversationsOut(BaseModel):
    conversations: list[ConversationOut]


class TranscriptOut(BaseModel):
    conversation_id: str
    markdown: str


class ErrorOut(BaseModel):
    """Every error: one sentence, and the request field it concerns ("" for none)."""

    error: str
    field: str = ""
    status: int
    head: HeadOut | None = None
