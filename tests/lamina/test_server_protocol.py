"""The HTTP protocols under ``lamina serve``, in process on a real uvicorn: which one
runs, what each connection's socket is set to, and the one-write answer."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn

from lamina._hub import ServerConfig
from lamina._protocols import ConnectionLimits, Guards
from lamina._server import PROTOCOLS, create_app, http_protocol
from lamina.pipeline.errors import ConfigError


@contextlib.contextmanager
def serving(tmp_path: Path, protocol: str) -> Iterator[tuple[tuple[str, int], uvicorn.Server]]:
    """``create_app`` on a real uvicorn with ``protocol``, in a thread, on a free port."""
    config = ServerConfig(store=str(tmp_path / "s.sqlite"))
    Guards.limits = ConnectionLimits.of(config)
    settings = uvicorn.Config(
        create_app(config),
        host="127.0.0.1",
        port=0,
        http=http_protocol(protocol),
        log_level="warning",
    )
    server = uvicorn.Server(settings)
    sock = settings.bind_socket()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(600):  # bounded: the server starts in well under a minute
            if server.started:
                break
            time.sleep(0.1)
        yield ("127.0.0.1", sock.getsockname()[1]), server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _get(address: tuple[str, int], path: str) -> tuple[socket.socket, bytes]:
    """A keep-alive GET on a new connection; the connection (still open) and the answer."""
    conn = socket.create_connection(address, timeout=30)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return conn, _read_until(conn, lambda got: b"\r\n\r\n" in got and got.endswith(b"ok"))


def _read_until(conn: socket.socket, done: Callable[[bytes], bool]) -> bytes:
    """What ``conn`` sends until ``done`` holds for all of it (the server may not close)."""
    got = b""
    while not done(got):
        chunk = conn.recv(65536)
        assert chunk, got
        got += chunk
    return got


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_every_connection_sends_small_writes_at_once(tmp_path: Path, protocol: str) -> None:
    """TCP_NODELAY on each accepted connection: uvicorn's listening socket has proto 0, so
    asyncio does not set it, and an answer written after its head waited for the client's
    delayed ACK (40 ms)."""
    with serving(tmp_path, protocol) as (address, server):
        conn, answer = _get(address, "/v1/health")
        with conn:
            assert answer.startswith(b"HTTP/1.1 200 ")
            connections = server.server_state.connections
            sockets = [c.transport.get_extra_info("socket") for c in connections]
            assert sockets
            assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_an_answer_without_body_bytes_still_sends_its_head(
    tmp_path: Path, protocol: str
) -> None:
    """The head is held for the body that follows it (one write); a HEAD answer has no
    body bytes, so its head goes out when the answer completes, and the connection
    serves the next request."""
    with serving(tmp_path, protocol) as (address, _), socket.create_connection(
        address, timeout=30
    ) as conn:
        conn.sendall(b"HEAD /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = _read_until(conn, lambda got: got.endswith(b"\r\n\r\n"))
        assert head.startswith(b"HTTP/1.1 405 ")  # the API's routes answer GET, not HEAD
        conn.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = _read_until(conn, lambda got: got.endswith(b"ok"))
        assert answer.startswith(b"HTTP/1.1 200 ")


def test_the_parser_is_httptools_when_installed_and_can_be_chosen() -> None:
    assert http_protocol() == PROTOCOLS["httptools"]  # the server extra installs it
    assert http_protocol("h11") == "lamina._protocols:GuardedH11"
    with pytest.raises(ConfigError) as refused:
        http_protocol("picohttp")
    assert refused.value.setting == "--http"


def test_a_served_app_freezes_what_start_up_made_and_an_embedded_one_does_not(
    tmp_path: Path,
) -> None:
    """``lamina serve`` (``freeze_gc``) moves start-up's objects out of the collector's
    reach when the app starts; an app a host embeds leaves the host's collector alone."""
    import asyncio
    import gc

    async def start(config: ServerConfig) -> int:
        app = create_app(config)
        async with app.router.lifespan_context(app):
            return gc.get_freeze_count()

    gc.unfreeze()
    try:
        assert asyncio.run(start(ServerConfig(store=str(tmp_path / "a.sqlite")))) == 0
        frozen = asyncio.run(start(ServerConfig(store=str(tmp_path / "b.sqlite"), freeze_gc=True)))
        assert frozen > 10_000  # the modules, the app and the hub at least
    finally:
        gc.unfreeze()
