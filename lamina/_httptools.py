"""uvicorn's httptools protocol with ``lamina._protocols.Guards``: the protocol of
``lamina serve`` when httptools is installed (it is in the server extra).

Imported only by uvicorn, by name, so a server without httptools never imports it.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lamina._protocols import MAX_HEAD_BYTES, MAX_PIPELINED, GuardedProtocol

__all__ = ["GuardedHttpTools"]


class _Phase(enum.Enum):
    """How much of the request being parsed has arrived."""

    IDLE = "idle"  # between requests (or the last one is complete)
    HEAD = "head"  # its first byte, not yet its whole head
    BODY = "body"  # its head, not yet its whole body


class _Refused(Exception):
    """Raised from a parser callback to stop parsing (httptools then raises its own
    error, which uvicorn answers through ``send_400_response``)."""


class GuardedHttpTools(GuardedProtocol, HttpToolsProtocol):
    """uvicorn's httptools protocol with ``Guards`` (deadlines, connection cap,
    TCP_NODELAY, one write per answer), driven by the parser's callbacks.

    A request pipelined behind one still being answered gets no deadline until that
    answer is complete (uvicorn stops reading meanwhile); then its own begins.

    httptools gathers a header whole before its callback, so the head is bounded twice:
    its parts as the callbacks hand them (URL, each header), and the reads that arrive
    while it is still incomplete; past ``MAX_HEAD_BYTES`` either way it is answered 431.
    At most ``MAX_PIPELINED`` requests wait behind the one being answered: the next one
    stops parsing, and the connection closes after answering those already read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard()
        self._phase = _Phase.IDLE
        self._refusal = b""  # why parsing stopped: a status line, or b"close"
        self._head_parts = 0  # bytes of the head's URL and headers handed over so far
        self._head_reads = 0  # bytes read while the head was incomplete, after its first
        self._began = False  # a request began in the read being parsed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(self._made(transport))
        self._admit()

    def data_received(self, data: bytes) -> None:
        if self._refusal:
            return  # parsing has stopped; the connection closes when its answers are out
        if (
            self._deadline is None
            and self._phase is _Phase.IDLE
            and not self._answering()
            and not self.transport.is_closing()
        ):
            self._wait(self._limits.header_timeout)  # a new request on a kept-alive connection
        self._began = False
        super().data_received(data)
        if self._phase is _Phase.HEAD and not self._began and not self._refusal:
            self._head_reads += len(data)
            if self._head_reads > MAX_HEAD_BYTES:
                self._too_long()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _Phase.HEAD
        self._began = True
        self._head_parts = self._head_reads = 0
        if self._deadline is None and not self._answering():
            self._wait(self._limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._head_part(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_part(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _head_part(self, size: int) -> None:
        self._head_parts += size
        if self._head_parts > MAX_HEAD_BYTES:
            self._refusal = b"431 Request Header Fields Too Large"
            raise _Refused(self._refusal.decode())

    def on_headers_complete(self) -> None:
        answering = self._answering()
        if answering and len(self.pipeline) >= MAX_PIPELINED:
            self._refusal = b"close"
            raise _Refused("too many pipelined requests")
        super().on_headers_complete()
        self._phase = _Phase.BODY
        if not answering:
            self._wait(self._limits.body_timeout)

    def send_400_response(self, msg: str) -> None:
        if self._refusal == b"close":
            # The requests already read are answered; the last of them closes.
            self._phase = _Phase.IDLE
            self.flow.pause_reading()
            if self.pipeline:
                self.pipeline[0][0].keep_alive = False
            else:
                self.cycle.keep_alive = False
        elif self._refusal:
            self._too_long()
        else:
            super().send_400_response(msg)

    def _too_long(self) -> None:
        self._refusal = b"431 Request Header Fields Too Large"
        if self._answerable():
            self._refuse(self._refusal)
        else:
            self._drop()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _Phase.IDLE
        self._stop()  # the whole request is here

    def on_response_complete(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        super().on_response_complete()
        if self._phase is _Phase.IDLE:
            if not self._answering():
                self._rest()
        elif self._deadline is None and not self.transport.is_closing():
            # a pipelined request, partly here: its deadline starts now
            head = self._phase is _Phase.HEAD
            self._wait(self._limits.header_timeout if head else self._limits.body_timeout)

    def _answering(self) -> bool:
        """A response to an earlier request on this connection is still being made."""
        return self.cycle is not None and not self.cycle.response_complete

    def _answerable(self) -> bool:
        return not self._answering() and self._phase is not _Phase.BODY
