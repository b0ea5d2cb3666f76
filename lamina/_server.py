"""``lamina serve``: the HTTP API (FastAPI on uvicorn) over ``ConversationHub``.

Building is CPU-bound and URL fetches can be slow, so every hub call runs in a worker
thread (a bounded pool) under a per-conversation lock: other conversations go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from lamina._api_models import (
    ConversationCreate,
    ConversationOut,
    ConversationsOut,
    ErrorOut,
    HeadOut,
    LayoutName,
    Provider,
    ReplyIn,
    ReplyOut,
    TranscriptOut,
    TurnIn,
    TurnOut,
)
from lamina._hub import ConversationHub, FieldError, ServerConfig, StaleHead
from pipeline import (
    ArgumentError,
    AttachmentError,
    BudgetExceeded,
    ConfigError,
    ConflictError,
    ConversationError,
    ConversationInfo,
    Head,
    LaminaError,
    StoreError,
    UnknownConversation,
)

__all__ = ["create_app", "is_loopback", "read_token", "serve"]

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# `lamina serve --workers N` hands its settings to each worker process through this.
CONFIG_ENV = "LAMINA_SERVE_CONFIG"

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 404, 409, 413, 422)
}


def _error(status: int, message: str, field: str = "", head: Head | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message, "field": field, "status": status}
    if head is not None:
        body["head"] = {"turn": head.turn, "hash": head.hash}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def _lamina_error(exc: LaminaError) -> JSONResponse:
    """A LaminaError as one JSON sentence with its field; the status says whose fault."""
    if isinstance(exc, FieldError):
        return _error(exc.status, str(exc), exc.field)
    if isinstance(exc, StaleHead):
        return _error(409, str(exc), "parent", exc.head)
    if isinstance(exc, ConflictError):
        head = Head(exc.head_turn, exc.head_hash)
        message = (
            f"another request saved turn {exc.head_turn} first; nothing was saved, "
            "fetch the conversation and build on its head"
        )
        return _error(409, message, "parent", head)
    if isinstance(exc, UnknownConversation):
        return _error(404, "no conversation with this id", "conversation_id")
    if isinstance(exc, ConversationError):
        return _error(409, str(exc))
    if isinstance(exc, BudgetExceeded):
        return _error(422, str(exc).splitlines()[0], "attach")
    if isinstance(exc, AttachmentError):
        return _error(422, str(exc), "attach")
    if isinstance(exc, ConfigError):
        return _error(422, str(exc), exc.setting)
    if isinstance(exc, ArgumentError):
        return _error(422, str(exc), exc.argument)
    if isinstance(exc, StoreError):
        return _error(503, "the store cannot be used right now; try again")
    return _error(422, str(exc))


def _field(loc: tuple[Any, ...]) -> str:
    """A pydantic location as a dotted field (``attach[0].note``), without "body"."""
    out = ""
    for part in loc[1:] if loc and loc[0] in ("body", "path", "query") else loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class BodyLimit:
    """Refuse request bodies over ``cap`` bytes with 413 (declared or streamed)."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app = app
        self.cap = cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.cap
        too_big = _error(413, f"the request body is larger than {cap} bytes", "body")
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > cap:
            await too_big(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > cap:
                raise _TooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not started:
                await too_big(scope, receive, send)


class _TooLarge(Exception):
    pass


class BearerAuth:
    """Every request needs ``Authorization: Bearer <token>`` (constant-time compare)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                denied = _error(401, "a valid bearer token is required", "authorization")
                await denied(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(config: ServerConfig) -> FastAPI:
    """The API over one store; ``config.token`` (when set) guards every route."""
    hub = ConversationHub(config)
    limiter = anyio.CapacityLimiter(config.threads)
    locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def call(conversation_id: str | None, fn: Callable[[], T]) -> T:
        """``fn`` in a worker thread, one at a time per conversation."""
        if conversation_id is None:
            return await anyio.to_thread.run_sync(fn, limiter=limiter)
        lock = locks.get(conversation_id)
        if lock is None:
            lock = asyncio.Lock()
            locks[conversation_id] = lock
        async with lock:
            return await anyio.to_thread.run_sync(fn, limiter=limiter)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        hub.close()

    app = FastAPI(
        title="Lamina",
        version="1",
        summary="Builds each turn's LLM prompt from typed context artifacts.",
        responses=ERRORS,
        lifespan=lifespan,
    )
    app.state.hub = hub

    @app.exception_handler(LaminaError)
    async def lamina_error(_: Request, exc: LaminaError) -> JSONResponse:
        return _lamina_error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        field = _field(tuple(first.get("loc", ())))
        message = str(first.get("msg", "invalid request"))
        if first.get("type") == "json_invalid":
            return _error(400, "the body is not valid JSON", "body")
        return _error(422, f"{field or 'body'}: {message}", field)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error ({type(exc).__name__}); the turn was not saved")

    def conversation_out(
        info: ConversationInfo, settings: ConversationCreate, head: Head
    ) -> ConversationOut:
        return ConversationOut(
            id=info.id,
            created=info.created,
            title=info.title,
            model=info.model,
            head=_head(head),
            provider=settings.provider,
            layout=settings.layout,
            vault=settings.vault,
        )

    @app.post("/v1/conversations", status_code=201)
    async def create(body: ConversationCreate) -> ConversationOut:
        """Start a conversation: system prompt, budget, tokenizer, policy, provider."""
        cid, _ = await call(None, lambda: hub.create(body))
        return conversation_out(*await call(cid, lambda: hub.info(cid)))

    @app.get("/v1/conversations")
    async def list_conversations() -> ConversationsOut:
        rows = await call(None, hub.all)
        return ConversationsOut(conversations=[conversation_out(*row) for row in rows])

    @app.get("/v1/conversations/{conversation_id}")
    async def get_conversation(conversation_id: str) -> ConversationOut:
        return conversation_out(*await call(conversation_id, lambda: hub.info(conversation_id)))

    @app.delete("/v1/conversations/{conversation_id}", status_code=204)
    async def delete(conversation_id: str) -> None:
        await call(conversation_id, lambda: hub.delete(conversation_id))

    # Turns and traces carry whole prompts: they are encoded in the worker thread, once,
    # without a second validation (their models still document them).
    @app.post("/v1/conversations/{conversation_id}/turns", response_model=TurnOut)
    async def build_turn(conversation_id: str, body: TurnIn) -> Response:
        """Build the next turn on ``parent`` (the head it continues), save it, answer it."""
        built = await call(conversation_id, lambda: hub.turn(conversation_id, body))
        return _raw(_turn(conversation_id, *built))

    @app.post("/v1/conversations/{conversation_id}/reply")
    async def reply(conversation_id: str, body: ReplyIn) -> ReplyOut:
        """Record the assistant's answer to the last turn (it joins the history, L4)."""
        head = await call(conversation_id, lambda: hub.reply(conversation_id, body))
        return ReplyOut(conversation_id=conversation_id, head=_head(head))

    @app.get("/v1/conversations/{conversation_id}/turns/{turn}/trace", response_model=TurnOut)
    async def turn_trace(conversation_id: str, turn: int) -> Response:
        """Turn ``turn`` in the trace format of ``lamina run --json``."""
        traced = await call(conversation_id, lambda: hub.trace(conversation_id, turn))
        return _raw(_turn(conversation_id, *traced))

    @app.get("/v1/conversations/{conversation_id}/trace", response_model=dict[str, Any])
    async def trace_document(conversation_id: str) -> Response:
        """Every turn: the document ``lamina run --json --store`` prints."""
        document = await call(conversation_id, lambda: _dumps(hub.trace_document(conversation_id)))
        return _raw(document)

    @app.get("/v1/conversations/{conversation_id}/turns/{turn}/request")
    async def provider_request(
        conversation_id: str,
        turn: int,
        provider: Provider | None = None,
        layout: LayoutName | None = None,
    ) -> Response:
        """Turn ``turn``'s request body for ``provider`` (default: the conversation's)."""
        return _raw(
            await call(
                conversation_id,
                lambda: _dumps(hub.request(conversation_id, turn, provider, layout)),
            )
        )

    @app.get("/v1/conversations/{conversation_id}/transcript")
    async def transcript(conversation_id: str) -> TranscriptOut:
        """The conversation as a markdown transcript (``lamina export``)."""
        text = await call(conversation_id, lambda: hub.transcript(conversation_id))
        return TranscriptOut(conversation_id=conversation_id, markdown=text)

    @app.get("/v1/health", response_class=PlainTextResponse)
    async def health() -> str:
        return "ok"

    app.add_middleware(BodyLimit, cap=config.max_body_bytes)
    if config.token is not None:
        app.add_middleware(BearerAuth, token=config.token)
    return app


def _head(head: Head) -> HeadOut:
    return HeadOut(turn=head.turn, hash=head.hash)


def _dumps(document: Any) -> bytes:
    """Compact UTF-8 JSON; a lone surrogate (a non-UTF-8 file name) stays a ``\\udcXX``
    escape, so the body is valid UTF-8 that loads back to the same str."""
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


def _turn(conversation_id: str, trace: dict[str, Any], head: Head) -> bytes:
    """A turn's body (``TurnOut``): the trace turn with the conversation id and new head."""
    head_out = {"turn": head.turn, "hash": head.hash}
    return _dumps({"conversation_id": conversation_id, "head": head_out, **trace})


def _raw(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever reaches this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: str | Path) -> str:
    """The bearer token in ``path`` (whitespace around it ignored); ConfigError if empty."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--token-file", f"cannot read {path}: {exc}") from None
    if len(token) < 16:
        raise ConfigError("--token-file", "the token must have at least 16 characters")
    return token


def app_from_env() -> FastAPI:
    """The app for a uvicorn worker process (``--workers N``), configured by the parent."""
    raw = json.loads(os.environ[CONFIG_ENV])
    vault = raw.pop("vault")
    return create_app(ServerConfig(vault=None if vault is None else Path(vault), **raw))


def serve(
    config: ServerConfig, host: str = "127.0.0.1", port: int = 8765, workers: int = 1
) -> None:
    """Run the API until interrupted; a non-loopback address needs a token."""
    import uvicorn

    if not is_loopback(host) and config.token is None:
        raise ConfigError(
            "--host", f"binding {host} exposes the API beyond this machine: give --token-file"
        )
    if workers > 1:
        raw = {
            "store": config.store,
            "vault": None if config.vault is None else str(config.vault),
            "token": config.token,
            "allow_private_network": config.allow_private_network,
            "max_body_bytes": config.max_body_bytes,
            "max_text_bytes": config.max_text_bytes,
            "url_timeout": config.url_timeout,
            "url_max_bytes": config.url_max_bytes,
            "warm": config.warm,
            "threads": config.threads,
        }
        os.environ[CONFIG_ENV] = json.dumps(raw)
        uvicorn.run(
            "lamina._server:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="warning",
        )
        return
    uvicorn.run(create_app(config), host=host, port=port, log_level="warning")
