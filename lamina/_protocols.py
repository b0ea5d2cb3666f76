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

__all__ = ["ConnectionLimits", "GuardedH11", "Guards"]

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]


@attrs.frozen
class ConnectionLimits:
    """What a connection may hold: seconds for the request head and for the body, and
    how many connections may be open at once."""

    header_timeout: float
    body_timeout: float
    max_connections: int

    @classmethod
    def of(cls, config: ServerConfig) -> ConnectionLimits:
        cap = config.max_connections or _descriptor_share()
        return cls(config.header_timeout, config.body_timeout, cap)


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
    has the connection, and says through ``_answerable()`` whether a late request may
    still be answered 408.

    A request's head must arrive within ``header_timeout`` seconds of its first byte (or
    of the connection), its body within ``body_timeout`` of the head; a late one is closed
    (408 when nothing was answered yet). When ``max_connections`` are open, a new one
    closes the oldest connection that is still waiting for a request to arrive, so
    half-sent requests cannot lock out the rest; if none is waiting the new one gets 503.
    Idle keep-alive connections close after uvicorn's ``timeout_keep_alive``."""

    limits: ClassVar[ConnectionLimits | None] = None

    # uvicorn's protocol attributes the guards use
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    connections: set[Any]
    app: Any

    _limits: ConnectionLimits
    _deadline: asyncio.TimerHandle | None
    _waiting_since: float  # loop time the current request began; 0: not waiting
    _writer: OneWrite | None

    def _guard(self) -> None:
        limits = Guards.limits
        if limits is None:  # a --workers child: the parent's settings
            limits = Guards.limits = ConnectionLimits.of(config_from_env())
        self._limits = limits
        self._deadline = None
        self._waiting_since = 0.0
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
            waiting = [c for c in self.connections if isinstance(c, Guards) and c._waiting_since]
            oldest = min(waiting, key=lambda c: c._waiting_since, default=None)
            if oldest is not None and oldest is not self:
                oldest._expire()
            else:  # every other connection is busy with a request: this one waits its turn
                self._refuse(b"503 Service Unavailable")

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


class GuardedH11(H11Protocol, Guards):
    """uvicorn's h11 protocol with ``Guards`` (deadlines, connection cap, TCP_NODELAY,
    one write per answer): the protocol when httptools is not installed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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

    def on_response_complete(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE:
            self._stop()  # idle: uvicorn's keep-alive timeout applies

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    def _answerable(self) -> bool:
        return self.conn.our_state is h11.IDLE and self.conn.their_state is not h11.SEND_BODY
