"""The HTTP/1.1 protocols under ``lamina serve``: uvicorn's, with read deadlines, a
connection cap, TCP_NODELAY and a response's head and body in one write.

uvicorn has no read deadline for a request head or body (a client sending one byte a
second held a connection for minutes) and no cap on open connections; ``Guards`` adds
both to its h11 protocol (``GuardedH11``) and to its httptools protocol
(``lamina._httptools.GuardedHttpTools``, used when httptools is installed: parsing a
request and writing its answer cost about a third of h11's).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, ClassVar

import attrs
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from lamina._hub import ServerConfig, config_from_env

__all__ = [
    "MAX_HEAD_BYTES",
    "MAX_PIPELINED",
    "ConnectionLimits",
    "GuardedH11",
    "GuardedProtocol",
    "Guards",
]

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]


# The most bytes a request head (request line and headers) may hold; past it the answer
# is 431 and the connection is closed. nginx reads heads into at most 4 x 8 KiB; h11's
# own default is 16 KiB. Lamina's requests carry a few short headers (a token, a type).
MAX_HEAD_BYTES = 32 * 1024

# The most requests one connection may have read and queued behind the one being
# answered (pipelined); the connection closes after answering them, unread the rest.
MAX_PIPELINED = 16


@attrs.frozen
class ConnectionLimits:
    """What a connection may hold: seconds for the request head, for the body and for
    an answer to make progress towards a client that does not read, and how many
    connections may be open at once."""

    header_timeout: float
    body_timeout: float
    max_connections: int
    write_timeout: float = 30.0

    @classmethod
    def of(cls, config: ServerConfig) -> ConnectionLimits:
        cap = config.max_connections or _descriptor_share()
        return cls(config.header_timeout, config.body_timeout, cap, config.write_timeout)


def _descriptor_share() -> int:
    """Half this process's descriptor limit (raised to its hard limit first), at most 4,096:
    the rest stays for the store, the vault and the URL fetches."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (ImportError, OSError, ValueError):
        return 512
    return max(8, min(4096, (soft if soft != resource.RLIM_INFINITY else 8192) // 2))


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """Send small writes at once (TCP_NODELAY). asyncio sets it only on sockets made with
    ``proto=IPPROTO_TCP``, and uvicorn's listening socket has ``proto=0``, so every answer
    under one segment (64 KiB on loopback) that followed its head waited for the client's
    delayed ACK: 40 ms for each reply, error and small turn."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class OneWrite(asyncio.Transport):
    """A connection's transport that writes a response's head together with the first
    body bytes that follow it: one ``send`` (and for a small answer one TCP segment)
    where uvicorn makes two. ``hold()`` (at ``http.response.start``) keeps the next
    write back; any later write, ``flush()`` or ``close()`` sends it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self.inner = transport
        self._hold = False
        self._held = b""

    def hold(self) -> None:
        self._hold = True

    def flush(self) -> None:
        self._hold = False
        if self._held:
            held, self._held = self._held, b""
            self.inner.write(held)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._hold and not self._held:
            self._held = bytes(data)  # the head: small
            return
        if self._held:
            data = self._held + data
            self._hold, self._held = False, b""
        self.inner.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        self.flush()
        self.inner.close()

    def abort(self) -> None:
        self._hold, self._held = False, b""
        self.inner.abort()

    def is_closing(self) -> bool:
        return self.inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def is_reading(self) -> bool:
        return self.inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def can_write_eof(self) -> bool:
        return self.inner.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self.inner.write_eof()

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size() + len(self._held)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)


def _head_with_body(app: ASGIApp, writer: Callable[[], OneWrite | None]) -> ASGIApp:
    """``app`` whose response head is held until its body follows (see ``OneWrite``)."""

    async def held(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_held(message: Message) -> None:
            transport = writer()
            if transport is not None and message["type"] == "http.response.start":
                transport.hold()
            await send(message)

        await app(scope, receive, send_held)

    return held


class Guards:
    """Deadlines, the connection cap, TCP_NODELAY and the one-write answer, for a uvicorn
    HTTP protocol (mixed in after it). The protocol calls ``_guard()`` when made,
    ``_made(transport)`` for the transport uvicorn should use, ``_admit()`` once uvicorn
    has the connection, ``_rest()`` when it waits for its next request, ``_write_paused()``
    and ``_write_resumed()`` from its flow control, and says through ``_answerable()``
    whether a late request may still be answered 408.

    A request's head must arrive within ``header_timeout`` seconds of its first byte (or
    of the connection), its body within ``body_timeout`` of the head; a late one is closed
    (408 when nothing was answered yet). An answer the client does not read (the
    transport's buffer over its high-water mark) must make progress within
    ``write_timeout`` seconds, else the connection is dropped (nginx's ``send_timeout``).

    The cap keeps one promise: a connection the server is working for is never closed
    to make room, and any other one may be. When ``max_connections`` are open, a new one
    closes the connection that has waited on its client the longest, idle kept-alive
    connections first (closing one loses no request); the others wait for a request's
    bytes or for the client to read an answer. If every connection is being worked for,
    the new one gets 503. Idle keep-alive connections close after uvicorn's
    ``timeout_keep_alive``."""

    limits: ClassVar[ConnectionLimits | None] = None

    # uvicorn's protocol attributes the guards use
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    connections: set[Any]
    app: Any

    _limits: ConnectionLimits
    _deadline: asyncio.TimerHandle | None
    _waiting_since: float  # loop time it began waiting on its client; 0: not waiting
    _idle: bool  # waiting for its next request, none in progress
    _stalled: asyncio.TimerHandle | None  # the write deadline, while writing is paused
    _stalled_since: float
    _unsent: int  # bytes buffered for the client when the write deadline was armed
    _writer: OneWrite | None

    def _guard(self) -> None:
        limits = Guards.limits
        if limits is None:  # a --workers child: the parent's settings
            limits = Guards.limits = ConnectionLimits.of(config_from_env())
        self._limits = limits
        self._deadline = None
        self._waiting_since = 0.0
        self._idle = False
        self._stalled = None
        self._stalled_since = 0.0
        self._unsent = 0
        self._writer = None
        self.app = _head_with_body(self.app, lambda: self._writer)

    def _made(self, transport: asyncio.BaseTransport) -> OneWrite:
        assert isinstance(transport, asyncio.Transport)
        _no_delay(transport)
        self._writer = OneWrite(transport)
        return self._writer

    def _admit(self) -> None:
        self._wait(self._limits.header_timeout)
        if len(self.connections) > self._limits.max_connections:
            waiting = [
                (key, c)
                for c in self.connections
                if isinstance(c, Guards) and c is not self and (key := c._waited()) is not None
            ]
            if waiting:
                min(waiting, key=lambda kc: kc[0])[1]._evict()
            else:  # every other connection is being worked for: this one waits its turn
                self._refuse(b"503 Service Unavailable")

    def _waited(self) -> tuple[bool, float] | None:
        """The eviction order: (not idle, since when it waits on its client); None while
        the server works for this connection."""
        if self.transport.is_closing():
            # closed, but waiting for the client to take its last answer: first to go
            return (False, 0.0) if self.transport.get_write_buffer_size() else None
        since = [t for t in (self._waiting_since, self._stalled_since) if t]
        return (not self._idle, min(since)) if since else None

    def _evict(self) -> None:
        """Close this connection to make room: an idle one silently, one whose client does
        not read at once (its unsent answer dropped), one mid-request as its deadline would."""
        if self._stalled_since or self.transport.is_closing():
            self._drop()
        elif self._idle:
            self._stop()
            self.transport.close()
        else:
            self._expire()

    def _answerable(self) -> bool:
        """Nothing was answered on this request yet and its body has not begun."""
        raise NotImplementedError

    def _wait(self, seconds: float) -> None:
        self._stop()
        self._waiting_since = self.loop.time()
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._waiting_since = 0.0
        self._idle = False

    def _rest(self) -> None:
        """Waiting for the next request (uvicorn's keep-alive timeout applies)."""
        self._stop()
        self._waiting_since = self.loop.time()
        self._idle = True

    def _expire(self) -> None:
        self._stop()
        if self._answerable():
            self._refuse(b"408 Request Timeout")
        elif not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(
                b"HTTP/1.1 " + status + b"\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
            )
            self.transport.close()

    # -- the write deadline ---------------------------------------------------------------

    def _write_paused(self) -> None:
        if self._stalled is None:
            self._stalled_since = self.loop.time()
            self._arm_write()

    def _write_resumed(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
        self._stalled = None
        self._stalled_since = 0.0

    def _arm_write(self) -> None:
        self._unsent = self.transport.get_write_buffer_size()
        self._stalled = self.loop.call_later(self._limits.write_timeout, self._write_expired)

    def _write_expired(self) -> None:
        if self.transport.get_write_buffer_size() < self._unsent:
            self._arm_write()  # the client reads, slowly: a new deadline for the rest
        else:
            self._drop()

    def _drop(self) -> None:
        """Close at once, dropping what the client never read (``close`` would wait for
        it to drain, which it does not)."""
        self._write_resumed()
        self._stop()
        self.transport.abort()


class GuardedProtocol(asyncio.Protocol, Guards):
    """``Guards``' hooks into the transport's flow control and the connection's end, for
    a uvicorn protocol listed after it (``class P(GuardedProtocol, UvicornProtocol)``)."""

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        self._write_resumed()
        super().connection_lost(exc)


class _StrictH11(h11.Connection):
    """h11's server side, remembering the status its last refusal asks for (431 for a
    head past ``MAX_HEAD_BYTES``) and refusing a request framed by both Transfer-Encoding
    and Content-Length (RFC 9112 6.3: a smuggling attempt; h11 alone would read the body
    as chunked and keep the connection open)."""

    refusal = 400

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refusal = exc.error_status_hint
            raise
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}
            if b"transfer-encoding" in names and b"content-length" in names:
                self.refusal = 400
                raise h11.RemoteProtocolError("both Transfer-Encoding and Content-Length")
        return event


class GuardedH11(GuardedProtocol, H11Protocol):
    """uvicorn's h11 protocol with ``Guards`` (deadlines, connection cap, TCP_NODELAY,
    one write per answer): the protocol when httptools is not installed. A request whose
    head passes ``MAX_HEAD_BYTES`` is answered 431. h11 reads one request at a time; a
    connection that keeps one waiting behind each answer is closed after answering
    ``MAX_PIPELINED`` of them in a row."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _StrictH11(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._pipelined = 0  # requests in a row that arrived before the last was answered
        self._guard()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(self._made(transport))
        self._admit()

    def data_received(self, data: bytes) -> None:
        before = self.conn.their_state
        if self._deadline is None and before is h11.IDLE and not self.transport.is_closing():
            self._wait(self._limits.header_timeout)  # a new request on a kept-alive connection
        super().data_received(data)
        after = self.conn.their_state
        if after is h11.SEND_BODY and before is not h11.SEND_BODY:
            self._wait(self._limits.body_timeout)
        elif after is not h11.IDLE and after is not h11.SEND_BODY:
            self._stop()  # the whole request is here (or the connection is done)

    def send_400_response(self, msg: str) -> None:
        conn = self.conn
        if isinstance(conn, _StrictH11) and conn.refusal == 431:
            self._refuse(b"431 Request Header Fields Too Large")
        else:
            super().send_400_response(msg)

    def on_response_complete(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE:
            self._rest()
            self._pipelined = 0
        elif self.cycle is not None and not self.cycle.response_complete:
            # The next request was already here: pipelined. After MAX_PIPELINED of them
            # in a row, as on httptools, this one's answer is the connection's last.
            self._pipelined += 1
            if self._pipelined >= MAX_PIPELINED:
                self.cycle.keep_alive = False

    def _answerable(self) -> bool:
        return self.conn.our_state is h11.IDLE and self.conn.their_state is not h11.SEND_BODY
