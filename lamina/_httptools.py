"""uvicorn's httptools protocol with ``lamina._protocols.Guards``: the protocol of
``lamina serve`` when httptools is installed (it is in the server extra).

Imported only by uvicorn, by name, so a server without httptools never imports it.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lamina._protocols import Guards

__all__ = ["GuardedHttpTools"]


class _Phase(enum.Enum):
    """How much of the request being parsed has arrived."""

    IDLE = "idle"  # between requests (or the last one is complete)
    HEAD = "head"  # its first byte, not yet its whole head
    BODY = "body"  # its head, not yet its whole body


class GuardedHttpTools(HttpToolsProtocol, Guards):
    """uvicorn's httptools protocol with ``Guards`` (deadlines, connection cap,
    TCP_NODELAY, one write per answer), driven by the parser's callbacks.

    A request pipelined behind one still being answered gets no deadline until that
    answer is complete (uvicorn stops reading meanwhile); then its own begins."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard()
        self._phase = _Phase.IDLE

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(self._made(transport))
        self._admit()

    def data_received(self, data: bytes) -> None:
        if (
            self._deadline is None
            and self._phase is _Phase.IDLE
            and not self._answering()
            and not self.transport.is_closing()
        ):
            self._wait(self._limits.header_timeout)  # a new request on a kept-alive connection
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _Phase.HEAD
        if self._deadline is None and not self._answering():
            self._wait(self._limits.header_timeout)

    def on_headers_complete(self) -> None:
        answering = self._answering()
        super().on_headers_complete()
        self._phase = _Phase.BODY
        if not answering:
            self._wait(self._limits.body_timeout)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _Phase.IDLE
        self._stop()  # the whole request is here

    def on_response_complete(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        super().on_response_complete()
        if self._phase is _Phase.IDLE:
            self._stop()  # idle: uvicorn's keep-alive timeout applies
        elif self._deadline is None and not self.transport.is_closing():
            # a pipelined request, partly here: its deadline starts now
            head = self._phase is _Phase.HEAD
            self._wait(self._limits.header_timeout if head else self._limits.body_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    def _answering(self) -> bool:
        """A response to an earlier request on this connection is still being made."""
        return self.cycle is not None and not self.cycle.response_complete

    def _answerable(self) -> bool:
        return not self._answering() and self._phase is not _Phase.BODY
