"""``lamina serve``: the HTTP API (FastAPI on uvicorn) over ``ConversationHub``.

Building is CPU-bound and URL fetches can be slow, so every hub call runs in a worker
thread (a bounded pool) under a per-conversation lock: other conversations go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import importlib.util
import ipaddress
import json
import os
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import attrs
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
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
from lamina._hub import (
    CONFIG_ENV,
    ConversationHub,
    FieldError,
    ServerConfig,
    StaleHead,
    config_from_env,
)
from lamina._protocols import ConnectionLimits, Guards
from lamina.pipeline import LaminaError
from lamina.pipeline.errors import (
    ArgumentError,
    AttachmentError,
    BudgetExceeded,
    ConfigError,
    ConflictError,
    ConversationError,
    StoreError,
    UnknownConversation,
)
from lamina.pipeline.store import ConversationInfo, Head

__all__ = ["create_app", "http_protocol", "is_loopback", "read_token", "serve"]

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 404, 409, 413, 422)
}


class _JSON(JSONResponse):
    """JSON that any str encodes to: a lone surrogate (a non-UTF-8 file name, or text
    saved before requests were checked) is its ``\\udcXX`` escape, never a 500."""

    def render(self, content: Any) -> bytes:
        return _dumps(content)


def _error(status: int, message: str, field: str = "", head: Head | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message, "field": field, "status": status}
    if head is not None:
        body["head"] = {"turn": head.turn, "hash": head.hash}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return _JSON(body, status_code=status, headers=headers)


def _hidden(text: str, roots: Sequence[str]) -> str:
    """``text`` without the server's own folders (``roots``, longest first): a path inside
    one is given relative to it, the folder itself is not named. A client learns which
    note is missing, never where the server keeps its files."""
    for root in roots:
        text = text.replace(root + os.sep, "").replace(" " + root, "").replace(root, "")
    return text


def _lamina_error(exc: LaminaError, roots: Sequence[str] = ()) -> JSONResponse:
    """A LaminaError as one JSON sentence with its field; the status says whose fault."""
    said = _hidden(str(exc), roots)
    if isinstance(exc, FieldError):
        return _error(exc.status, said, exc.field)
    if isinstance(exc, StaleHead):
        return _error(409, said, "parent", exc.head)
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
        return _error(409, said)
    if isinstance(exc, BudgetExceeded):
        return _error(422, said.splitlines()[0], "attach")
    if isinstance(exc, AttachmentError):
        return _error(422, said, "attach")
    if isinstance(exc, ConfigError):
        return _error(422, said, exc.setting)
    if isinstance(exc, ArgumentError):
        return _error(422, said, exc.argument)
    if isinstance(exc, StoreError):
        return _error(503, "the store cannot be used right now; try again")
    return _error(422, said)


def _field(loc: tuple[Any, ...]) -> str:
    """A pydantic location as a dotted field (``attach[0].note``), without "body"."""
    out = ""
    for part in loc[1:] if loc and loc[0] in ("body", "path", "query") else loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class BodyLimit:
    """Read the whole request body before the app sees it; over ``cap`` bytes (declared,
    or counted as it streams, chunked included) is 413, never a parse error."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app = app
        self.cap = cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.cap
        declared = _header(scope, b"content-length")
        if declared.isdigit() and int(declared) > cap:
            await _too_big(cap)(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left (or the connection was closed for being slow)
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > cap:
                await _too_big(cap)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay(whole, receive), send)


def _too_big(cap: int) -> JSONResponse:
    # The rest of the body is read and dropped (the connection stays usable), within the
    # connection's body deadline.
    return _error(413, f"the request body is larger than {cap} bytes", "body")


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return b""


@attrs.frozen
class Lane:
    """A route a host calls every turn: its request model and what answers a valid one
    (the conversation id and the request in, the answer's JSON bytes out)."""

    model: type[BaseModel]
    answer: Callable[[str, Any], Awaitable[bytes]]


class HotLane:
    """``POST /v1/conversations/{id}/turns`` and ``.../reply``, the two routes a host
    calls every turn, without FastAPI's per-request machinery (routing over every route,
    dependency solving, validating the answer again): the same JSON parse and request
    validation, the same work, the same answer, in about 0.2 ms less CPU. It takes only
    a body sent as ``Content-Type: application/json`` that parses and validates; any
    other (no type, another type or parameter, a parse failure, ``RecursionError``
    included) goes on to the FastAPI route, which answers it as every other route does."""

    PATH = re.compile(r"/v1/conversations/([^/]+)/([a-z]+)")

    def __init__(self, app: ASGIApp, lanes: Mapping[str, Lane], roots: Sequence[str]) -> None:
        self.app = app
        self.lanes = lanes
        self.roots = roots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = lane = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope["root_path"]:
            found = self.PATH.fullmatch(scope["path"])  # decoded, as Starlette's routes see it
            lane = None if found is None else self.lanes.get(found.group(2))
        if found is None or lane is None or _header(scope, b"content-type") != b"application/json":
            await self.app(scope, receive, send)
            return
        message = await receive()  # BodyLimit hands the whole body in one message
        if message["type"] != "http.request":
            return  # the client left
        try:
            body = lane.model.model_validate(json.loads(message.get("body", b"")))
        except (ValueError, ValidationError, RecursionError):
            # FastAPI's route answers it (400, 422): deep JSON that this parse took may
            # not parse deeper in FastAPI's stack, and the models refuse it past 64 levels
            await self.app(scope, _replay(message, receive), send)
            return
        try:
            response = _raw(await lane.answer(found.group(1), body))
        except LaminaError as exc:
            response = _lamina_error(exc, self.roots)
        await response(scope, receive, send)


def _replay(first: Message, receive: Receive) -> Receive:
    """``receive`` that hands ``first`` again before what follows it."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return first

    return replay


class HostGuard:
    """Without a token, only requests that name this machine: a ``Host`` outside
    ``allowed`` (a page whose DNS name was rebound to 127.0.0.1) or an ``Origin`` outside
    it (another site's page) is refused with 403 before any route runs."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = _header(scope, b"host")
            origin = _header(scope, b"origin")
            refused = ""
            if host and _host_name(b"//" + host) not in self.allowed:
                refused = "host"
            elif origin and _host_name(origin) not in self.allowed:
                refused = "origin"
            if refused:
                message = (
                    f"this server has no token, so it answers only requests addressed to "
                    f"{', '.join(sorted(self.allowed))} (see --allow-host); the {refused} "
                    "header names another"
                )
                await _error(403, message, refused)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _host_name(value: bytes) -> str:
    """The host name of a URL or ``//host:port`` (lower case, no trailing dot); "" if none."""
    try:
        name = urlsplit(value.decode("latin-1")).hostname or ""
    except ValueError:
        return ""
    return name.rstrip(".")


LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(config: ServerConfig) -> frozenset[str]:
    """The Host names a server without a token answers: this machine's, and the extras."""
    names = {*LOCAL_NAMES, *config.allowed_hosts}
    return frozenset(n.strip().strip("[]").lower().rstrip(".") for n in names if n.strip())


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
    fetching = anyio.CapacityLimiter(config.fetch_threads)
    locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def call(
        conversation_id: str | None, fn: Callable[[], T], pool: anyio.CapacityLimiter = limiter
    ) -> T:
        """``fn`` in a worker thread of ``pool``, one at a time per conversation."""
        if conversation_id is None:
            return await anyio.to_thread.run_sync(fn, limiter=pool)
        lock = locks.get(conversation_id)
        if lock is None:
            lock = asyncio.Lock()
            locks[conversation_id] = lock
        async with lock:
            return await anyio.to_thread.run_sync(fn, limiter=pool)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if config.freeze_gc:
            # Start-up's objects live as long as the process; frozen, a full collection no
            # longer walks them: that walk, at random turns, was most of a turn's HTTP cost
            # over the in-process hub (p50 1.55-2.57 ms over seven runs, 0.89-1.13 frozen).
            gc.collect()
            gc.freeze()
        yield
        hub.close()

    app = FastAPI(
        title="Lamina",
        version="1",
        summary="Builds each turn's LLM prompt from typed context artifacts.",
        responses=ERRORS,
        lifespan=lifespan,
        default_response_class=_JSON,
    )
    app.state.hub = hub

    @app.exception_handler(LaminaError)
    async def lamina_error(_: Request, exc: LaminaError) -> JSONResponse:
        return _lamina_error(exc, hub.roots)

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
        if exc.status_code == 400:  # FastAPI's "There was an error parsing the body"
            return _error(400, "the body is not valid JSON, or nests too deeply", "body")
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises it after this answer, and uvicorn logs the traceback.
        return _error(500, f"internal error ({type(exc).__name__}); see the server's log")

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
            defer_library=settings.defer_library,
            vault=settings.vault,
        )

    @app.post("/v1/conversations", status_code=201)
    async def create(body: ConversationCreate) -> ConversationOut:
        """Start a conversation: system prompt, budget, tokenizer, policy, provider."""

        def created() -> tuple[ConversationInfo, ConversationCreate, Head]:
            cid, _ = hub.create(body)  # nobody else knows the id yet: no lock to take
            return hub.info(cid)

        return conversation_out(*await call(None, created))  # one thread hop, not two

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

    async def turn_body(conversation_id: str, body: TurnIn) -> bytes:
        pool = fetching if any("url" in form for form in body.attach) else limiter
        return await call(
            conversation_id, lambda: _turn(conversation_id, *hub.turn(conversation_id, body)), pool
        )

    # Turns and traces carry whole prompts: they are encoded in the worker thread, once,
    # without a second validation (their models still document them). A valid turn
    # request takes the HotLane (below) and reaches this route only when it does not.
    @app.post("/v1/conversations/{conversation_id}/turns", response_model=TurnOut)
    async def build_turn(conversation_id: str, body: TurnIn) -> Response:
        """Build the next turn on ``parent`` (the head it continues), save it, answer it."""
        return _raw(await turn_body(conversation_id, body))

    async def reply_body(conversation_id: str, body: ReplyIn) -> bytes:
        head = await call(conversation_id, lambda: hub.reply(conversation_id, body))
        out = ReplyOut(conversation_id=conversation_id, head=_head(head))
        return _dumps(out.model_dump(mode="json"))

    @app.post("/v1/conversations/{conversation_id}/reply", response_model=ReplyOut)
    async def reply(conversation_id: str, body: ReplyIn) -> Response:
        """Record the assistant's answer to the last turn (it joins the history, L4)."""
        return _raw(await reply_body(conversation_id, body))

    @app.get("/v1/conversations/{conversation_id}/turns/{turn}/trace", response_model=TurnOut)
    async def turn_trace(conversation_id: str, turn: int) -> Response:
        """Turn ``turn`` in the trace format of ``lamina run --json``."""
        traced = await call(
            conversation_id, lambda: _turn(conversation_id, *hub.trace(conversation_id, turn))
        )
        return _raw(traced)

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

    lanes = {"turns": Lane(TurnIn, turn_body), "reply": Lane(ReplyIn, reply_body)}
    # innermost: after the body and auth checks
    app.add_middleware(HotLane, lanes=lanes, roots=hub.roots)
    app.add_middleware(BodyLimit, cap=config.max_body_bytes)
    if config.token is not None:
        app.add_middleware(BearerAuth, token=config.token)
    else:
        app.add_middleware(HostGuard, allowed=allowed_hosts(config))
    return app


def _head(head: Head) -> HeadOut:
    return HeadOut(turn=head.turn, hash=head.hash)


def _dumps(document: Any) -> bytes:
    """Compact UTF-8 JSON; a lone surrogate (a non-UTF-8 file name) stays a ``\\udcXX``
    escape, so the body is valid UTF-8 that loads back to the same str.

    orjson first (a 240 kB trace turn: about 0.1 ms against 0.5-0.7 ms for ``json``); it
    refuses surrogates and integers beyond 64 bits, which take the ``json`` path."""
    try:
        return orjson.dumps(document)
    except (orjson.JSONEncodeError, TypeError):
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
    return create_app(config_from_env())


PROTOCOLS = {
    "httptools": "lamina._httptools:GuardedHttpTools",
    "h11": "lamina._protocols:GuardedH11",
}


def http_protocol(choice: str = "auto") -> str:
    """The uvicorn protocol ``lamina serve --http CHOICE`` runs: httptools when installed
    (``auto``) or asked for (ConfigError if it is missing), else h11."""
    if choice not in ("auto", *PROTOCOLS):
        raise ConfigError("--http", f"is one of auto, {', '.join(PROTOCOLS)}; not {choice!r}")
    if choice == "auto":
        choice = "httptools" if importlib.util.find_spec("httptools") else "h11"
    elif choice == "httptools" and importlib.util.find_spec("httptools") is None:
        raise ConfigError("--http", "httptools is not installed: pip install 'lamina[server]'")
    return PROTOCOLS[choice]


def serve(
    config: ServerConfig, host: str = "127.0.0.1", port: int = 8765, workers: int = 1
) -> None:
    """Run the API until interrupted; a non-loopback address needs a token. Prints the
    address it listens on (the real port for ``port=0``) once the socket is bound."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    if not is_loopback(host) and config.token is None:
        raise ConfigError(
            "--host", f"binding {host} exposes the API beyond this machine: give --token-file"
        )
    config = attrs.evolve(config, allowed_hosts=(*config.allowed_hosts, host))
    limits = ConnectionLimits.of(config)
    config = attrs.evolve(config, max_connections=limits.max_connections, freeze_gc=True)
    Guards.limits = limits
    common: dict[str, Any] = {
        "host": host,
        "port": port,
        "http": http_protocol(config.http),
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": False,  # no proxy is trusted: X-Forwarded-* are not read
        "timeout_keep_alive": 5,
        "workers": workers,
    }
    if workers > 1:
        raw = attrs.asdict(config, recurse=False)
        raw["vault"] = None if config.vault is None else str(config.vault)
        raw["allowed_hosts"] = list(config.allowed_hosts)
        os.environ[CONFIG_ENV] = json.dumps(raw)
        settings = uvicorn.Config("lamina._server:app_from_env", factory=True, **common)
    else:
        settings = uvicorn.Config(create_app(config), **common)
    sock = settings.bind_socket()
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    auth = "bearer token required" if config.token else "no token: loopback names only"
    where = "" if config.vault is None else f", vault {config.vault}"
    print(
        f"lamina serve: listening on http://{shown}:{bound} (store {_shown_store(config.store)}"
        f"{where}; {auth}; {workers} worker{'s' if workers > 1 else ''}); Ctrl+C stops",
        flush=True,
    )
    if workers > 1:
        Multiprocess(settings, sockets=[sock]).run()
    else:
        uvicorn.Server(settings).run(sockets=[sock])


def _shown_store(store: str) -> str:
    """The store as it may be printed: a URL without its user, password and query."""
    if "://" not in store:
        return store
    parts = urlsplit(store)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=host, query="", fragment="").geturl()
